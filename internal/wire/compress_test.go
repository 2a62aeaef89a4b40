package wire

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

var allCompressors = []CompressorID{CompressorNoop, CompressorSnappy, CompressorZlib, CompressorZstd}

// sampleMessages returns messages of various shapes and sizes.
func sampleMessages(t testing.TB) map[string][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 100_000)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	var docs []bsoncore.Document
	for i := range 2000 {
		docs = append(docs, doc(t, bsonD("_id", i, "name", "customer", "tags", []any{"a", "b"}, "score", float64(i)/3)))
	}
	body := doc(t, bsonD("insert", "coll", "$db", "test"))
	return map[string][]byte{
		"small":         AppendMsg(nil, 3, 4, 0, doc(t, bsonD("find", "c", "$db", "d"))),
		"with sequence": AppendMsg(nil, 3, 4, FlagChecksumPresent, body, Sequence{Identifier: "documents", Documents: concatDocs(docs...)}),
		"incompressible": AppendMsg(nil, 5, 0, 0, doc(t, bsonD("insert", "c")),
			Sequence{Identifier: "documents", Documents: doc(t, bsonD("bin", random))}),
		"header only": AppendHeader(nil, Header{MessageLength: 16, RequestID: 1, OpCode: OpMsg}),
		"reply":       AppendReply(nil, 9, 8, doc(t, bsonD("ok", 1.0))),
	}
}

func TestCompressRoundTrip(t *testing.T) {
	for name, msg := range sampleMessages(t) {
		for _, id := range allCompressors {
			t.Run(name+"/"+id.String(), func(t *testing.T) {
				prefix := []byte("keep")
				c, err := Compress(slices.Clone(prefix), msg, id)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.HasPrefix(c, prefix) {
					t.Fatal("prefix clobbered")
				}
				c = c[len(prefix):]
				ch, err := ParseCompressedHeader(c)
				if err != nil {
					t.Fatal(err)
				}
				h, _ := ParseHeader(msg)
				if ch.Header.RequestID != h.RequestID || ch.Header.ResponseTo != h.ResponseTo ||
					ch.OriginalOpCode != h.OpCode || int(ch.UncompressedSize) != len(msg)-HeaderLen || ch.Compressor != id {
					t.Fatalf("%+v", ch)
				}
				out, err := Decompress(slices.Clone(prefix), c, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(out[len(prefix):], msg) || !bytes.HasPrefix(out, prefix) {
					t.Fatal("round trip differs")
				}
				// Exactly at the limit is accepted.
				if _, err := Decompress(nil, c, len(msg)); err != nil {
					t.Fatalf("at limit: %v", err)
				}
				_, err = Decompress(nil, c, len(msg)-1)
				wantErr(t, err, ErrMessageTooLarge, ErrDecompressedSize)
			})
		}
	}
}

// wrap builds an OP_COMPRESSED message around a raw compressed payload.
func wrap(orig OpCode, size int32, id CompressorID, data []byte) []byte {
	b := AppendHeader(nil, Header{RequestID: 1, ResponseTo: 2, OpCode: OpCompressed})
	b = le.AppendUint32(b, uint32(orig))
	b = le.AppendUint32(b, uint32(size))
	b = append(b, byte(id))
	return withLen(append(b, data...))
}

func zlibBytes(t testing.TB, p []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func zstdBytes(t testing.TB, p []byte, opts ...zstd.EOption) []byte {
	enc, err := zstd.NewWriter(nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(p, nil)
}

// zstdStream compresses p without a frame content size.
func zstdStream(t testing.TB, p []byte) []byte {
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecompressErrors(t *testing.T) {
	msg := AppendMsg(nil, 1, 2, 0, doc(t, bsonD("find", "c", "filter", bsonD("x", bytes.Repeat([]byte("ab"), 500)))))
	payload := msg[HeaderLen:]
	n := int32(len(payload))
	snap := s2.EncodeSnappy(nil, payload)
	zl := zlibBytes(t, payload)
	zs := zstdBytes(t, payload)
	zsNoSize := zstdStream(t, payload)
	// A real bomb: 8 MB of zeros compresses to a few KB.
	zeros := make([]byte, 8<<20)
	bomb := zstdBytes(t, zeros)
	zlibBomb := zlibBytes(t, zeros)

	cases := []struct {
		name string
		msg  []byte
		max  int
		want []error
	}{
		{"truncated fixed fields", wrap(OpMsg, n, 0, nil)[:20], 0, []error{ErrTruncated}},
		{"fixed fields short", withLen(wrap(OpMsg, n, 0, nil)[:24]), 0, []error{ErrTruncated}},
		{"not OP_COMPRESSED", msg, 0, []error{ErrUnexpectedOpCode}},
		{"unknown compressor", wrap(OpMsg, n, 4, payload), 0, []error{ErrUnknownCompressor}},
		{"unknown compressor 255", wrap(OpMsg, n, 255, payload), 0, []error{ErrUnknownCompressor}},
		{"unknown original opcode", wrap(4242, n, 0, payload), 0, []error{ErrUnknownOpCode}},
		{"nested OP_COMPRESSED", wrap(OpCompressed, n, 0, payload), 0, []error{ErrUnexpectedOpCode}},
		{"negative size", wrap(OpMsg, -1, 0, payload), 0, []error{ErrDecompressedSize}},
		{"size above default max", wrap(OpMsg, DefaultMaxMessageSize-15, 0, payload), 0, []error{ErrMessageTooLarge, ErrDecompressedSize}},
		{"size above given max", wrap(OpMsg, n, 0, payload), int(n) + 15, []error{ErrMessageTooLarge}},
		{"zstd bomb above limit", wrap(OpMsg, 8<<20, CompressorZstd, bomb), 1 << 20, []error{ErrMessageTooLarge}},
		{"zstd bomb lying about size", wrap(OpMsg, 1000, CompressorZstd, bomb), 0, []error{ErrDecompressedSize}},
		{"zlib bomb lying about size", wrap(OpMsg, 1000, CompressorZlib, zlibBomb), 0, []error{ErrDecompressedSize}},
		{"noop size larger", wrap(OpMsg, n+1, CompressorNoop, payload), 0, []error{ErrDecompressedSize}},
		{"noop size smaller", wrap(OpMsg, n-1, CompressorNoop, payload), 0, []error{ErrDecompressedSize}},
		{"snappy size larger", wrap(OpMsg, n+1, CompressorSnappy, snap), 0, []error{ErrDecompressedSize}},
		{"snappy size smaller", wrap(OpMsg, n-1, CompressorSnappy, snap), 0, []error{ErrDecompressedSize}},
		{"snappy corrupt", wrap(OpMsg, n, CompressorSnappy, append(slices.Clone(snap[:len(snap)/2]), 0xff)), 0, []error{ErrCorruptCompressed}},
		{"snappy bad varint", wrap(OpMsg, n, CompressorSnappy, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}), 0, []error{ErrCorruptCompressed}},
		{"zlib size larger", wrap(OpMsg, n+1, CompressorZlib, zl), 0, []error{ErrDecompressedSize}},
		{"zlib size smaller", wrap(OpMsg, n-1, CompressorZlib, zl), 0, []error{ErrDecompressedSize}},
		{"zlib bad header", wrap(OpMsg, n, CompressorZlib, []byte{1, 2, 3, 4}), 0, []error{ErrCorruptCompressed}},
		{"zlib truncated", wrap(OpMsg, n, CompressorZlib, zl[:len(zl)/2]), 0, []error{ErrDecompressedSize}},
		{"zlib bad adler", wrap(OpMsg, n, CompressorZlib, append(slices.Clone(zl[:len(zl)-1]), zl[len(zl)-1]^1)), 0, []error{ErrCorruptCompressed}},
		{"zlib trailing bytes", wrap(OpMsg, n, CompressorZlib, append(slices.Clone(zl), 0)), 0, []error{ErrCorruptCompressed}},
		{"zstd size larger", wrap(OpMsg, n+1, CompressorZstd, zs), 0, []error{ErrDecompressedSize}},
		{"zstd size smaller", wrap(OpMsg, n-1, CompressorZstd, zs), 0, []error{ErrDecompressedSize}},
		{"zstd no content size, size smaller", wrap(OpMsg, n-1, CompressorZstd, zsNoSize), 0, []error{ErrDecompressedSize}},
		{"zstd no content size, size larger", wrap(OpMsg, n+1, CompressorZstd, zsNoSize), 0, []error{ErrDecompressedSize}},
		{"zstd garbage", wrap(OpMsg, n, CompressorZstd, []byte("not zstd at all")), 0, []error{ErrCorruptCompressed}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := []byte("keep")
			start := time.Now()
			out, err := Decompress(dst, c.msg, c.max)
			wantErr(t, err, c.want...)
			if !bytes.Equal(out, []byte("keep")) {
				t.Fatalf("dst changed on error: %d bytes", len(out))
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}

	// Streams without a content size decode when the declared size is right.
	if out, err := Decompress(nil, wrap(OpMsg, n, CompressorZstd, zsNoSize), 0); err != nil || !bytes.Equal(out[HeaderLen:], payload) {
		t.Fatalf("zstd without content size: %v", err)
	}
}

// TestDecompressBombDoesNotAllocate checks that the bomb guard fires before
// any output buffer is allocated: only the small error value may be.
func TestDecompressBombDoesNotAllocate(t *testing.T) {
	bomb := wrap(OpMsg, 1<<30, CompressorZstd, []byte{1, 2, 3})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		_, err := Decompress(nil, bomb, 0)
		wantErr(t, err, ErrMessageTooLarge)
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
		t.Fatalf("allocated %d bytes for 10 rejected bombs", d)
	}
}

func TestCompressErrors(t *testing.T) {
	msg := AppendMsg(nil, 1, 2, 0, doc(t, bsonD("ping", 1)))
	c, err := Compress(nil, msg, CompressorSnappy)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		msg  []byte
		id   CompressorID
		want error
	}{
		"short":              {msg[:10], CompressorZstd, ErrMessageTooSmall},
		"length mismatch":    {msg[:len(msg)-1], CompressorZstd, ErrLengthMismatch},
		"messageLength < 16": {put32(msg, 0, 3), CompressorZstd, ErrMessageTooSmall},
		"already compressed": {c, CompressorZstd, ErrUnexpectedOpCode},
		"unknown compressor": {msg, 4, ErrUnknownCompressor},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := Compress([]byte("keep"), tc.msg, tc.id)
			wantErr(t, err, tc.want)
			if string(out) != "keep" {
				t.Fatalf("dst changed: %q", out)
			}
		})
	}
}

func TestCompressorNames(t *testing.T) {
	for _, id := range allCompressors {
		got, ok := CompressorByName(id.String())
		if !ok || got != id {
			t.Fatalf("%v: %v %v", id, got, ok)
		}
	}
	for _, bad := range []string{"", "Snappy", "lz4", "zstd "} {
		if _, ok := CompressorByName(bad); ok {
			t.Fatalf("%q accepted", bad)
		}
	}
	if CompressorID(9).String() != "CompressorID(9)" {
		t.Fatal(CompressorID(9).String())
	}
}

func TestMustNotCompress(t *testing.T) {
	for _, name := range []string{"hello", "isMaster", "ismaster", "saslStart", "saslContinue", "getnonce",
		"authenticate", "createUser", "updateUser", "copydbSaslStart", "copydbgetnonce", "copydb"} {
		if !MustNotCompress(name) {
			t.Errorf("%s should not be compressed", name)
		}
	}
	for _, name := range []string{"find", "insert", "ping", "", "Hello", "getMore"} {
		if MustNotCompress(name) {
			t.Errorf("%s may be compressed", name)
		}
	}
}

func TestCanCompress(t *testing.T) {
	find := doc(t, bsonD("find", "c"))
	hello := doc(t, bsonD("hello", 1))
	sasl := doc(t, bsonD("saslStart", 1))
	seq := Sequence{Identifier: "documents", Documents: find}
	compressed, _ := Compress(nil, AppendMsg(nil, 1, 0, 0, find), CompressorNoop)
	cases := map[string]struct {
		msg  []byte
		want bool
	}{
		"find":                {AppendMsg(nil, 1, 0, 0, find), true},
		"hello":               {AppendMsg(nil, 1, 0, 0, hello), false},
		"saslStart after seq": {rawMsg(0, false, sec1("documents", find), sec0(sasl)), false},
		"find after seq":      {AppendMsg(nil, 1, 0, 0, find, seq), true},
		"legacy query":        {AppendQuery(nil, 1, 0, "admin.$cmd", 0, -1, find), false},
		"reply":               {AppendReply(nil, 1, 2, find), true},
		"compressed":          {compressed, false},
		"short":               {[]byte{1, 2}, false},
		"OP_MSG no body":      {rawMsg(0, false, sec1("documents", find)), false},
		"OP_MSG bad section":  {rawMsg(0, false, []byte{7}), false},
	}
	for name, c := range cases {
		if got := CanCompress(c.msg); got != c.want {
			t.Errorf("%s: CanCompress = %v", name, got)
		}
	}
}

// TestDriverCompressionInterop checks both directions against the Go
// driver's own compression code.
func TestDriverCompressionInterop(t *testing.T) {
	msgs := sampleMessages(t)
	for name, msg := range msgs {
		for _, id := range allCompressors {
			opts := driver.CompressionOpts{Compressor: wiremessage.CompressorID(id), ZlibLevel: 6, ZstdLevel: 6,
				UncompressedSize: int32(len(msg) - HeaderLen)}
			// Driver compresses, we decompress.
			data, err := driver.CompressPayload(msg[HeaderLen:], opts)
			if err != nil {
				t.Fatal(err)
			}
			h, _ := ParseHeader(msg)
			out, err := Decompress(nil, wrap(h.OpCode, opts.UncompressedSize, id, data), 0)
			if err != nil {
				t.Fatalf("%s/%v: %v", name, id, err)
			}
			if !bytes.Equal(out[HeaderLen:], msg[HeaderLen:]) {
				t.Fatalf("%s/%v: driver->us differs", name, id)
			}
			// We compress, the driver decompresses.
			c, err := Compress(nil, msg, id)
			if err != nil {
				t.Fatal(err)
			}
			plain, err := driver.DecompressPayload(c[CompressedHeaderLen:], opts)
			if err != nil {
				t.Fatalf("%s/%v: driver rejects our output: %v", name, id, err)
			}
			if !bytes.Equal(plain, msg[HeaderLen:]) {
				t.Fatalf("%s/%v: us->driver differs", name, id)
			}
			// The driver's header readers agree with ours.
			_, reqID, respTo, op, rem, ok := wiremessage.ReadHeader(c)
			if !ok || reqID != h.RequestID || respTo != h.ResponseTo || op != wiremessage.OpCompressed {
				t.Fatalf("driver header %v %v %v %v", reqID, respTo, op, ok)
			}
			orig, rem, ok := wiremessage.ReadCompressedOriginalOpCode(rem)
			size, rem, ok2 := wiremessage.ReadCompressedUncompressedSize(rem)
			cid, _, ok3 := wiremessage.ReadCompressedCompressorID(rem)
			if !ok || !ok2 || !ok3 || OpCode(orig) != h.OpCode || size != opts.UncompressedSize || CompressorID(cid) != id {
				t.Fatalf("driver compressed header %v %v %v", orig, size, cid)
			}
		}
	}
}

// TestCompressConcurrent exercises the pooled codec state from several
// goroutines under -race.
func TestCompressConcurrent(t *testing.T) {
	msgs := sampleMessages(t)
	var list [][]byte
	for _, m := range msgs {
		list = append(list, m)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	deadline := time.Now().Add(5 * time.Second)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var cbuf, dbuf []byte
			for i := range 40 {
				if time.Now().After(deadline) {
					return
				}
				msg := list[(g+i)%len(list)]
				id := allCompressors[(g*7+i)%len(allCompressors)]
				var err error
				cbuf, err = Compress(cbuf[:0], msg, id)
				if err == nil {
					dbuf, err = Decompress(dbuf[:0], cbuf, 0)
				}
				if err == nil && !bytes.Equal(dbuf, msg) {
					err = errors.New("round trip differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestDecompressAbsentPayloadDoesNotAllocate checks that a short message
// declaring a large uncompressedSize (under the limit) is refused before
// the declared size is allocated, for every compressor.
func TestDecompressAbsentPayloadDoesNotAllocate(t *testing.T) {
	const declared = 16 << 20
	for _, id := range allCompressors {
		var data []byte
		switch id {
		case CompressorSnappy:
			data = binary.AppendUvarint(nil, declared) // a true size, no data
		case CompressorZlib:
			data = []byte{0x78, 0x9c, 0x03, 0x00}
		case CompressorZstd:
			data = []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0x58, 1, 0, 0}
		default:
			data = []byte{1, 2, 3}
		}
		msg := wrap(OpMsg, declared, id, data)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 10 {
			_, err := Decompress(nil, msg, 0)
			wantErr(t, err, ErrDecompressedSize)
		}
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
			t.Errorf("%v: allocated %d bytes for 10 messages of %d bytes", id, d, len(msg))
		}
	}
}

// TestDecompressBestRatio checks that the ratio bounds Decompress applies
// before allocating never refuse real output: a message of zeros, which
// every codec compresses as well as it can, decompresses from our own
// encoders and from other common ones.
func TestDecompressBestRatio(t *testing.T) {
	payload := make([]byte, 8<<20)
	msg := withLen(append(AppendHeader(nil, Header{RequestID: 1, OpCode: OpMsg}), payload...))
	inputs := map[string][]byte{
		"zlib best": wrap(OpMsg, int32(len(payload)), CompressorZlib, zlibBest(t, payload)),
		"zstd best": wrap(OpMsg, int32(len(payload)), CompressorZstd, zstdBytes(t, payload, zstd.WithEncoderLevel(zstd.SpeedBestCompression))),
		"snappy":    wrap(OpMsg, int32(len(payload)), CompressorSnappy, s2.EncodeSnappyBest(nil, payload)),
	}
	for _, id := range allCompressors {
		c, err := Compress(nil, msg, id)
		if err != nil {
			t.Fatal(err)
		}
		inputs[id.String()] = c
	}
	for name, c := range inputs {
		t.Logf("%s: ratio %d", name, len(payload)/(len(c)-CompressedHeaderLen))
		out, err := Decompress(nil, c, 0)
		if err != nil || len(out) != HeaderLen+len(payload) {
			t.Errorf("%s (%d bytes, ratio %d): %d bytes, %v", name, len(c), len(payload)/(len(c)-CompressedHeaderLen), len(out), err)
		}
	}
}

func zlibBest(t testing.TB, p []byte) []byte {
	var buf bytes.Buffer
	w, err := zlib.NewWriterLevel(&buf, zlib.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
