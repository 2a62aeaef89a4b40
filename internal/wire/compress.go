package wire

import (
	"bytes"
	"errors"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// CompressorID is the OP_COMPRESSED compressorId.
type CompressorID uint8

// Compressor ids; 4-255 are reserved.
const (
	CompressorNoop   CompressorID = 0
	CompressorSnappy CompressorID = 1
	CompressorZlib   CompressorID = 2
	CompressorZstd   CompressorID = 3
)

// String returns the handshake name ("noop", "snappy", "zlib", "zstd").
func (c CompressorID) String() string {
	switch c {
	case CompressorNoop:
		return "noop"
	case CompressorSnappy:
		return "snappy"
	case CompressorZlib:
		return "zlib"
	case CompressorZstd:
		return "zstd"
	}
	return "CompressorID(" + strconv.Itoa(int(c)) + ")"
}

// CompressorByName maps a handshake compression name to its id. Names are
// case-sensitive, as in the hello "compression" array.
func CompressorByName(name string) (CompressorID, bool) {
	switch name {
	case "noop":
		return CompressorNoop, true
	case "snappy":
		return CompressorSnappy, true
	case "zlib":
		return CompressorZlib, true
	case "zstd":
		return CompressorZstd, true
	}
	return 0, false
}

// MustNotCompress reports whether a message carrying this command must be
// sent uncompressed (handshake and authentication commands, per the
// OP_COMPRESSED specification).
func MustNotCompress(commandName string) bool {
	switch commandName {
	case "hello", "isMaster", "ismaster", "saslStart", "saslContinue", "getnonce", "authenticate",
		"createUser", "updateUser", "copydbSaslStart", "copydbgetnonce", "copydb":
		return true
	}
	return false
}

// CanCompress reports whether the whole message msg may be wrapped in
// OP_COMPRESSED: not if it already is one, not if it is an OP_QUERY (only
// the legacy handshake still uses it), not if it is an OP_MSG whose command
// is listed by MustNotCompress, and not if it is too malformed to tell. It
// scans only the section headers, not the documents.
func CanCompress(msg []byte) bool {
	if len(msg) < HeaderLen {
		return false
	}
	switch OpCode(int32(le.Uint32(msg[12:]))) {
	case OpCompressed, OpQuery:
		return false
	case OpMsg:
		body := findBody(msg)
		if body == nil {
			return false
		}
		return !MustNotCompress(CommandName(body))
	}
	return true
}

// findBody locates the kind-0 document of an OP_MSG without validating it.
func findBody(msg []byte) []byte {
	p := HeaderLen + 4
	for p < len(msg) {
		kind := msg[p]
		p++
		if kind > 1 || len(msg)-p < 4 {
			return nil
		}
		n := int(int32(le.Uint32(msg[p:])))
		if n < 5 || n > len(msg)-p {
			return nil
		}
		if kind == 0 {
			return msg[p : p+n]
		}
		p += n
	}
	return nil
}

// CompressedHeaderLen is the size of an OP_COMPRESSED message before its
// compressed bytes: the header, originalOpcode, uncompressedSize and
// compressorId.
const CompressedHeaderLen = HeaderLen + 4 + 4 + 1

// CompressedHeader is the fixed part of an OP_COMPRESSED message.
type CompressedHeader struct {
	// Header is the OP_COMPRESSED message header.
	Header Header
	// OriginalOpCode is the opcode of the wrapped message.
	OriginalOpCode OpCode
	// UncompressedSize is the declared size of the wrapped message without
	// its header.
	UncompressedSize int32
	// Compressor identifies the algorithm.
	Compressor CompressorID
}

// ParseCompressedHeader reads the fixed fields of a whole OP_COMPRESSED
// message (exact length and opcode are checked; the fields are not).
func ParseCompressedHeader(msg []byte) (CompressedHeader, error) {
	const op = "parse OP_COMPRESSED"
	h, err := parseFrame(op, msg, OpCompressed)
	if err != nil {
		return CompressedHeader{}, err
	}
	if len(msg) < CompressedHeaderLen {
		return CompressedHeader{}, protoErr(op, ErrTruncated, "fixed fields truncated")
	}
	return CompressedHeader{
		Header:           h,
		OriginalOpCode:   OpCode(int32(le.Uint32(msg[16:]))),
		UncompressedSize: int32(le.Uint32(msg[20:])),
		Compressor:       CompressorID(msg[24]),
	}, nil
}

// Compress wraps the whole uncompressed message msg into an OP_COMPRESSED
// message with the same requestID and responseTo, appended to dst. dst's
// spare capacity must not overlap msg. Compress does not apply the
// MustNotCompress rule; use CanCompress for that. It is safe for
// concurrent use: encoder state is pooled.
func Compress(dst []byte, msg []byte, id CompressorID) ([]byte, error) {
	const op = "compress"
	if len(msg) < HeaderLen {
		return dst, protoErr(op, ErrMessageTooSmall, "fewer than 16 bytes")
	}
	h, err := ParseHeader(msg)
	if err != nil {
		return dst, err
	}
	if int(h.MessageLength) != len(msg) {
		return dst, protoErr(op, ErrLengthMismatch,
			"messageLength "+strconv.Itoa(int(h.MessageLength))+" but "+strconv.Itoa(len(msg))+" bytes")
	}
	if h.OpCode == OpCompressed {
		return dst, protoErr(op, ErrUnexpectedOpCode, "message is already OP_COMPRESSED")
	}
	payload := msg[HeaderLen:]
	start := len(dst)
	dst = AppendHeader(dst, Header{RequestID: h.RequestID, ResponseTo: h.ResponseTo, OpCode: OpCompressed})
	dst = le.AppendUint32(dst, uint32(h.OpCode))
	dst = le.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, byte(id))
	switch id {
	case CompressorNoop:
		dst = append(dst, payload...)
	case CompressorSnappy:
		n := s2.MaxEncodedLen(len(payload))
		if n < 0 {
			return dst[:start], protoErr(op, ErrMessageTooLarge, "too large for snappy")
		}
		dst = slices.Grow(dst, n)
		out := s2.EncodeSnappy(dst[len(dst):len(dst)+n], payload)
		dst = dst[:len(dst)+len(out)]
	case CompressorZlib:
		e := zlibEncoders.Get().(*zlibEncoder)
		e.out.b = slices.Grow(dst, len(payload)/2+64)
		e.w.Reset(&e.out)
		_, werr := e.w.Write(payload)
		if cerr := e.w.Close(); werr == nil {
			werr = cerr
		}
		dst = e.out.b
		e.out.b = nil
		zlibEncoders.Put(e)
		if werr != nil {
			return dst[:start], &ProtocolError{Op: op, Err: ErrCorruptCompressed, Detail: "zlib", Cause: werr}
		}
	case CompressorZstd:
		enc, err := zstdEncoder()
		if err != nil {
			return dst[:start], &ProtocolError{Op: op, Err: ErrUnknownCompressor, Detail: "zstd", Cause: err}
		}
		dst = enc.EncodeAll(payload, dst)
	default:
		return dst[:start], protoErr(op, ErrUnknownCompressor, id.String())
	}
	if len(dst)-start > math.MaxInt32 {
		return dst[:start], protoErr(op, ErrMessageTooLarge, "compressed message exceeds int32")
	}
	le.PutUint32(dst[start:], uint32(len(dst)-start))
	return dst, nil
}

// Decompress unwraps the whole OP_COMPRESSED message msg and appends the
// original message to dst, with its header rebuilt from originalOpcode and
// the same requestID and responseTo. Before decompressing anything it
// rejects an uncompressedSize that is negative (ErrDecompressedSize) or
// above maxSize-16 (ErrMessageTooLarge, also matching ErrDecompressedSize),
// an unknown compressor (ErrUnknownCompressor) and an unknown or nested
// originalOpcode (ErrUnknownOpCode / ErrUnexpectedOpCode). Output never
// exceeds the declared size, and data that yields a different size fails
// with ErrDecompressedSize. maxSize <= 0 means DefaultMaxMessageSize. It is
// safe for concurrent use: decoder state is pooled.
func Decompress(dst []byte, msg []byte, maxSize int) ([]byte, error) {
	const op = "decompress"
	ch, err := ParseCompressedHeader(msg)
	if err != nil {
		return dst, err
	}
	if maxSize <= 0 {
		maxSize = DefaultMaxMessageSize
	}
	switch {
	case ch.OriginalOpCode == OpCompressed:
		return dst, protoErr(op, ErrUnexpectedOpCode, "nested OP_COMPRESSED")
	case !ch.OriginalOpCode.Known():
		return dst, protoErr(op, ErrUnknownOpCode, "originalOpcode "+ch.OriginalOpCode.String())
	case ch.UncompressedSize < 0:
		return dst, protoErr(op, ErrDecompressedSize, "negative uncompressedSize")
	case int64(ch.UncompressedSize) > int64(maxSize)-HeaderLen:
		return dst, &ProtocolError{Op: op, Err: ErrMessageTooLarge, Cause: ErrDecompressedSize,
			Detail: "uncompressedSize " + strconv.Itoa(int(ch.UncompressedSize)) + " exceeds limit " + strconv.Itoa(maxSize)}
	}
	if ch.Compressor > CompressorZstd {
		return dst, protoErr(op, ErrUnknownCompressor, ch.Compressor.String())
	}
	size := int(ch.UncompressedSize)
	data := msg[CompressedHeaderLen:]
	if err := reachable(ch.Compressor, data, size); err != nil {
		return dst, err
	}
	start := len(dst)
	dst = slices.Grow(dst, HeaderLen+size)
	dst = AppendHeader(dst, Header{
		MessageLength: int32(HeaderLen + size),
		RequestID:     ch.Header.RequestID,
		ResponseTo:    ch.Header.ResponseTo,
		OpCode:        ch.OriginalOpCode,
	})
	// out is exactly the declared size: no decoder below may write past it.
	out := dst[len(dst) : len(dst)+size : len(dst)+size]
	var derr error
	switch ch.Compressor {
	case CompressorNoop:
		copy(out, data) // reachable checked the size
	case CompressorSnappy:
		derr = snappyDecode(out, data)
	case CompressorZlib:
		derr = zlibDecode(out, data)
	case CompressorZstd:
		derr = zstdDecode(out, data)
	}
	if derr != nil {
		return dst[:start], derr
	}
	return dst[:len(dst)+size], nil
}

// Most output bytes one input byte can become, per compressor: deflate
// encodes at best 258 bytes in a 1-bit length and a 1-bit distance code;
// snappy at best 64 bytes in a 3-byte copy (S2's longer repeats never come
// from a MongoDB peer, and our own encoder writes plain snappy); zstd at
// best a 128 KiB block in a 3-byte RLE block header plus its byte.
const (
	maxRatioZlib   = 1032
	maxRatioSnappy = 22
	maxRatioZstd   = 128 << 10 / 4
)

// reachable returns an error if data cannot decompress to size bytes.
// Decompress allocates the declared size up front, so without this check a
// message of a few bytes could make it allocate up to maxSize for output
// that is not there; with it, what a message makes us allocate is bounded by
// its own length times the codec's best compression ratio.
func reachable(id CompressorID, data []byte, size int) error {
	n := int64(len(data))
	ok := false
	switch id {
	case CompressorNoop:
		ok = len(data) == size
	case CompressorSnappy:
		d, err := s2.DecodedLen(data)
		if err != nil {
			return corrupt("snappy", err)
		}
		ok = d == size && int64(size) <= n*maxRatioSnappy
	case CompressorZlib:
		ok = int64(size) <= n*maxRatioZlib
	case CompressorZstd:
		ok = int64(size) <= n*maxRatioZstd
	}
	if !ok {
		return sizeMismatch(id.String())
	}
	return nil
}

func sizeMismatch(name string) error {
	return protoErr("decompress", ErrDecompressedSize, name+" output size differs from uncompressedSize")
}

func corrupt(name string, cause error) error {
	return &ProtocolError{Op: "decompress", Err: ErrCorruptCompressed, Detail: name, Cause: cause}
}

func snappyDecode(out, data []byte) error {
	n, err := s2.DecodedLen(data)
	if err != nil {
		return corrupt("snappy", err)
	}
	if n != len(out) {
		return sizeMismatch("snappy")
	}
	// Decode writes into out because its capacity equals the decoded length.
	// It also accepts S2's extensions of the snappy block format; that is
	// harmless here because the output size is fixed in advance.
	res, err := s2.Decode(out, data)
	if err != nil {
		return corrupt("snappy", err)
	}
	if len(res) != len(out) {
		return sizeMismatch("snappy")
	}
	return nil
}

// sliceWriter appends everything written to b.
type sliceWriter struct{ b []byte }

func (w *sliceWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

type zlibEncoder struct {
	w   *zlib.Writer
	out sliceWriter
}

var zlibEncoders = sync.Pool{New: func() any {
	e := &zlibEncoder{}
	// DefaultCompression is a valid level, so this cannot fail.
	e.w, _ = zlib.NewWriterLevel(&e.out, zlib.DefaultCompression)
	return e
}}

type zlibDecoder struct {
	r   io.ReadCloser
	src bytes.Reader
	one [1]byte
}

// emptyZlib is a complete zlib stream of no bytes, used to create a reader
// that is then Reset for each message (zlib.NewReader insists on reading a
// valid header up front).
var errNoZlibReader = errors.New("zlib reader unavailable")

var errTrailingZlib = errors.New("trailing bytes after zlib stream")

var emptyZlib = []byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01}

var zlibDecoders = sync.Pool{New: func() any {
	d := &zlibDecoder{}
	d.src.Reset(emptyZlib)
	r, err := zlib.NewReader(&d.src)
	if err != nil {
		return d
	}
	d.r = r
	return d
}}

func zlibDecode(out, data []byte) error {
	d := zlibDecoders.Get().(*zlibDecoder)
	defer func() {
		d.src.Reset(nil)
		zlibDecoders.Put(d)
	}()
	if d.r == nil {
		return corrupt("zlib", errNoZlibReader)
	}
	d.src.Reset(data)
	if err := d.r.(zlib.Resetter).Reset(&d.src, nil); err != nil {
		return corrupt("zlib", err)
	}
	if _, err := io.ReadFull(d.r, out); err != nil {
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return sizeMismatch("zlib")
		}
		return corrupt("zlib", err)
	}
	// The stream must end exactly here; reading on also verifies the
	// Adler-32 trailer.
	n, err := io.ReadFull(d.r, d.one[:])
	switch {
	case n > 0:
		return sizeMismatch("zlib")
	case err != io.EOF:
		return corrupt("zlib", err)
	}
	// The flate reader consumes its input byte by byte (bytes.Reader is an
	// io.ByteReader), so anything left is garbage after the stream.
	if d.src.Len() != 0 {
		return corrupt("zlib", errTrailingZlib)
	}
	return nil
}

var (
	zstdEncOnce sync.Once
	zstdEnc     *zstd.Encoder
	zstdEncErr  error
	zstdDecOnce sync.Once
	zstdDec     *zstd.Decoder
	zstdDecErr  error
)

// zstdEncoder returns the shared encoder; EncodeAll is safe for concurrent
// use and keeps a bounded set of encoder states internally.
func zstdEncoder() (*zstd.Encoder, error) {
	zstdEncOnce.Do(func() {
		zstdEnc, zstdEncErr = zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedDefault),
			// An empty payload still produces a frame other decoders accept.
			zstd.WithZeroFrames(true))
	})
	return zstdEnc, zstdEncErr
}

// zstdDecoder returns the shared decoder. DecodeAll is safe for concurrent
// use. DecodeAllCapLimit makes it stop at the capacity of the output slice,
// which Decompress sets to the declared size, and MaxMemory is a second,
// absolute bound in case that ever changes.
func zstdDecoder() (*zstd.Decoder, error) {
	zstdDecOnce.Do(func() {
		zstdDec, zstdDecErr = zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(0),
			zstd.WithDecoderMaxMemory(math.MaxInt32),
			zstd.WithDecodeAllCapLimit(true))
	})
	return zstdDec, zstdDecErr
}

func zstdDecode(out, data []byte) error {
	dec, err := zstdDecoder()
	if err != nil {
		return corrupt("zstd", err)
	}
	res, err := dec.DecodeAll(data, out[:0])
	if err != nil {
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrFrameSizeExceeded) {
			return sizeMismatch("zstd")
		}
		return corrupt("zstd", err)
	}
	if len(res) != len(out) {
		return sizeMismatch("zstd")
	}
	if len(res) > 0 && &res[0] != &out[0] {
		copy(out, res)
	}
	return nil
}
