// Package wire implements the MongoDB wire protocol as a pooler needs it:
// framing (the 16-byte header and bounded whole-message reads), OP_MSG
// parsing and building, the legacy OP_QUERY / OP_REPLY pair that drivers
// still use for their first hello, and OP_COMPRESSED with the noop, snappy,
// zlib and zstd compressors.
//
// The package does no I/O policy: it starts no goroutines and sets no
// deadlines. ReadMessage reads from whatever io.Reader it is given, so
// timeouts and cancellation belong to the caller (net.Conn deadlines).
//
// Every function here runs on the proxy hot path for every message, so the
// parsers are zero-copy views over the caller's buffer (Msg.Body,
// Sequence.Documents and friends alias the message) and the builders append
// into caller-provided slices. A Msg is valid only as long as the message
// buffer it was parsed from is not reused.
//
// Everything read from the network is bounded before it is trusted: lengths
// are checked against the enclosing slice before slicing, message sizes are
// checked against a maximum before allocating, and a declared decompressed
// size is checked before decompressing. Malformed input yields an error,
// never a panic. Errors are *ProtocolError values that unwrap to one of the
// Err* sentinels, so callers branch with errors.Is.
//
// Facts used here come from the public MongoDB specifications (OP_MSG,
// OP_COMPRESSED, the legacy opcodes) and the project's protocol notes. All
// integers on the wire are little-endian.
package wire
