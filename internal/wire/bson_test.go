package wire

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// everyType is a document using every BSON type the driver can encode.
func everyType(t testing.TB) bsoncore.Document {
	oid := bson.ObjectID{1, 2, 3}
	dec, _ := bson.ParseDecimal128("1.5")
	return doc(t, bson.D{
		{Key: "double", Value: 1.5},
		{Key: "string", Value: "héllo"},
		{Key: "empty", Value: ""},
		{Key: "doc", Value: bson.D{{Key: "a", Value: bson.D{{Key: "b", Value: int32(1)}}}}},
		{Key: "array", Value: bson.A{1, "x", bson.A{}, bson.D{}}},
		{Key: "binary", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}},
		{Key: "undefined", Value: bson.Undefined{}},
		{Key: "oid", Value: oid},
		{Key: "bool", Value: true},
		{Key: "date", Value: bson.NewDateTimeFromTime(time.Unix(1, 0))},
		{Key: "null", Value: nil},
		{Key: "regex", Value: bson.Regex{Pattern: "^a.*", Options: "i"}},
		{Key: "dbptr", Value: bson.DBPointer{DB: "db.c", Pointer: oid}},
		{Key: "js", Value: bson.JavaScript("function(){}")},
		{Key: "symbol", Value: bson.Symbol("sym")},
		{Key: "cws", Value: bson.CodeWithScope{Code: "x", Scope: bson.D{{Key: "x", Value: 1}}}},
		{Key: "int32", Value: int32(-3)},
		{Key: "ts", Value: bson.Timestamp{T: 1, I: 2}},
		{Key: "int64", Value: int64(1) << 40},
		{Key: "dec", Value: dec},
		{Key: "min", Value: bson.MinKey{}},
		{Key: "max", Value: bson.MaxKey{}},
	})
}

func TestValidateDocumentAcceptsDriverOutput(t *testing.T) {
	d := everyType(t)
	if err := ValidateDocument(d); err != nil {
		t.Fatal(err)
	}
	if err := d.Validate(); err != nil {
		t.Fatalf("driver disagrees: %v", err)
	}
	if err := ValidateDocument(doc(t, bson.D{})); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(100, func() { _ = ValidateDocument(d) }); a != 0 {
		t.Fatalf("allocs %v", a)
	}
}

// nest returns a document nested depth levels deep.
func nest(depth int) []byte {
	// {a: {a: ... {} }}
	inner := []byte{5, 0, 0, 0, 0}
	for range depth {
		b := le.AppendUint32(nil, 0)
		b = append(b, byte(bsoncore.TypeEmbeddedDocument), 'a', 0)
		b = append(b, inner...)
		b = append(b, 0)
		inner = withLen(b)
	}
	return inner
}

func TestValidateDocumentErrors(t *testing.T) {
	good := everyType(t)
	// elem builds {k: <raw value>} with the given type byte.
	elem := func(typ bsoncore.Type, raw ...byte) []byte {
		b := le.AppendUint32(nil, 0)
		b = append(b, byte(typ), 'k', 0)
		b = append(b, raw...)
		return withLen(append(b, 0))
	}
	str := func(n int32, s string) []byte { return append(le.AppendUint32(nil, uint32(n)), s...) }
	cases := map[string][]byte{
		"empty slice":              nil,
		"four bytes":               {5, 0, 0, 0},
		"length below 5":           {4, 0, 0, 0, 0},
		"length above slice":       put32(good, 0, int32(len(good)+1)),
		"length below slice":       put32(good, 0, int32(len(good)-1)),
		"no terminator":            append(slices.Clone(good[:len(good)-1]), 1),
		"unknown type":             elem(0x14),
		"type zero mid-document":   elem(0x00),
		"key unterminated":         withLen(append(le.AppendUint32(nil, 0), 0x10, 'k', 'e', 'y', 0)),
		"int32 truncated":          elem(bsoncore.TypeInt32, 1, 2),
		"double truncated":         elem(bsoncore.TypeDouble, 1, 2, 3),
		"string length zero":       elem(bsoncore.TypeString, str(0, "")...),
		"string length negative":   elem(bsoncore.TypeString, str(-1, "")...),
		"string overruns":          elem(bsoncore.TypeString, str(50, "abc\x00")...),
		"string no NUL":            elem(bsoncore.TypeString, str(3, "abc")...),
		"embedded overruns":        elem(bsoncore.TypeEmbeddedDocument, 50, 0, 0, 0, 0),
		"embedded too short":       elem(bsoncore.TypeEmbeddedDocument, 4, 0, 0, 0, 0),
		"embedded invalid inside":  elem(bsoncore.TypeArray, elem(0x77)...),
		"binary negative":          elem(bsoncore.TypeBinary, 0xff, 0xff, 0xff, 0xff, 0),
		"binary overruns":          elem(bsoncore.TypeBinary, 9, 0, 0, 0, 0, 1),
		"regex unterminated":       elem(bsoncore.TypeRegex, 'a', 'b'),
		"regex options missing":    elem(bsoncore.TypeRegex, 'a', 0, 'i'),
		"dbpointer short oid":      elem(bsoncore.TypeDBPointer, append(str(2, "a\x00"), 1, 2, 3)...),
		"code w scope too small":   elem(bsoncore.TypeCodeWithScope, 13, 0, 0, 0, 2, 0, 0, 0, 'x', 0, 5, 0, 0),
		"code w scope bad scope":   elem(bsoncore.TypeCodeWithScope, append(append(le.AppendUint32(nil, 16), str(2, "x\x00")...), 6, 0, 0, 0, 0, 0)...),
		"code w scope total large": elem(bsoncore.TypeCodeWithScope, append(append(le.AppendUint32(nil, 99), str(2, "x\x00")...), 5, 0, 0, 0, 0)...),
		"too deep":                 nest(maxBSONDepth + 1),
	}
	for name, d := range cases {
		t.Run(name, func(t *testing.T) {
			wantErr(t, ValidateDocument(d), ErrInvalidBSON)
		})
	}
	if err := ValidateDocument(nest(maxBSONDepth)); err != nil {
		t.Fatalf("max depth rejected: %v", err)
	}
	okCWS := elem(bsoncore.TypeCodeWithScope, append(append(le.AppendUint32(nil, 15), str(2, "x\x00")...), 5, 0, 0, 0, 0)...)
	if err := ValidateDocument(okCWS); err != nil {
		t.Fatalf("minimal code w scope: %v", err)
	}
}

func TestCommandName(t *testing.T) {
	if got := CommandName(doc(t, bsonD("hello", 1, "$db", "admin"))); got != "hello" {
		t.Fatal(got)
	}
	odd := doc(t, bsonD("someFutureCommand", 1))
	got := CommandName(odd)
	if got != "someFutureCommand" {
		t.Fatal(got)
	}
	// The result must not alias the buffer.
	copy(odd[5:], "XXXX")
	if got != "someFutureCommand" {
		t.Fatal("CommandName aliases its input")
	}
	for _, bad := range [][]byte{nil, {5, 0, 0, 0, 0}, {9, 0, 0, 0, 0x10, 'a', 'b', 'c', 'd'}, {200, 0, 0, 0, 0x10, 'a', 0}} {
		if got := CommandName(bad); got != "" {
			t.Fatalf("CommandName(%v) = %q", bad, got)
		}
	}
	long := strings.Repeat("z", 300)
	if got := CommandName(doc(t, bsonD(long, 1))); got != long {
		t.Fatal("long name")
	}
}
