package wire

import (
	"bytes"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// maxBSONDepth bounds document nesting during validation. Servers refuse
// far less (maxBSONDepth defaults to 200 and cannot exceed 999), so nothing
// a server would accept is rejected, while the recursion stays bounded no
// matter what arrives in a 48 MB message.
const maxBSONDepth = 1000

// ValidateDocument checks that doc is exactly one well-formed BSON document:
// its length prefix equals len(doc), it ends in a NUL, every element has a
// known type, a terminated key and a value that fits, strings are
// NUL-terminated, and embedded documents, arrays and code-with-scope are
// valid recursively (to a bounded depth). It does not check UTF-8 or array
// key numbering; the server does that. It does not allocate on success.
func ValidateDocument(doc []byte) error {
	if reason := validateDoc(doc, 0); reason != "" {
		return protoErr("validate BSON", ErrInvalidBSON, reason)
	}
	return nil
}

// validateDoc returns "" if doc is valid, else a static reason. Static
// strings keep the success path and the error path allocation-free until
// the caller decides to build an error.
func validateDoc(doc []byte, depth int) string {
	if len(doc) < 5 {
		return "document shorter than 5 bytes"
	}
	if int64(int32(le.Uint32(doc))) != int64(len(doc)) {
		return "document length prefix does not match its extent"
	}
	if doc[len(doc)-1] != 0 {
		return "document not NUL-terminated"
	}
	if depth > maxBSONDepth {
		return "document nested too deeply"
	}
	end := len(doc) - 1
	i := 4
	for i < end {
		t := bsoncore.Type(doc[i])
		i++
		k := bytes.IndexByte(doc[i:end], 0)
		if k < 0 {
			return "element key not NUL-terminated"
		}
		i += k + 1
		rest := doc[i:end]
		var size int
		switch t {
		case bsoncore.TypeDouble, bsoncore.TypeDateTime, bsoncore.TypeTimestamp, bsoncore.TypeInt64:
			size = 8
		case bsoncore.TypeInt32:
			size = 4
		case bsoncore.TypeDecimal128:
			size = 16
		case bsoncore.TypeObjectID:
			size = 12
		case bsoncore.TypeBoolean:
			size = 1
		case bsoncore.TypeUndefined, bsoncore.TypeNull, bsoncore.TypeMinKey, bsoncore.TypeMaxKey:
			size = 0
		case bsoncore.TypeString, bsoncore.TypeJavaScript, bsoncore.TypeSymbol:
			n, reason := stringSize(rest)
			if reason != "" {
				return reason
			}
			size = n
		case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
			if len(rest) < 4 {
				return "embedded document truncated"
			}
			n := int(int32(le.Uint32(rest)))
			if n < 5 || n > len(rest) {
				return "embedded document length out of range"
			}
			if reason := validateDoc(rest[:n], depth+1); reason != "" {
				return reason
			}
			size = n
		case bsoncore.TypeBinary:
			if len(rest) < 5 {
				return "binary truncated"
			}
			n := int(int32(le.Uint32(rest)))
			if n < 0 || n > len(rest)-5 {
				return "binary length out of range"
			}
			size = 5 + n
		case bsoncore.TypeRegex:
			p := bytes.IndexByte(rest, 0)
			if p < 0 {
				return "regex pattern not NUL-terminated"
			}
			o := bytes.IndexByte(rest[p+1:], 0)
			if o < 0 {
				return "regex options not NUL-terminated"
			}
			size = p + 1 + o + 1
		case bsoncore.TypeDBPointer:
			n, reason := stringSize(rest)
			if reason != "" {
				return reason
			}
			size = n + 12
		case bsoncore.TypeCodeWithScope:
			if len(rest) < 4 {
				return "code with scope truncated"
			}
			total := int(int32(le.Uint32(rest)))
			// int32 total + string (>= 5 bytes) + document (>= 5 bytes).
			if total < 14 || total > len(rest) {
				return "code with scope length out of range"
			}
			cws := rest[4:total]
			n, reason := stringSize(cws)
			if reason != "" {
				return reason
			}
			if reason := validateDoc(cws[n:], depth+1); reason != "" {
				return reason
			}
			size = total
		default:
			return "unknown element type"
		}
		if size > len(rest) {
			return "element value overruns its document"
		}
		i += size
	}
	return ""
}

// stringSize returns the wire size (int32 length prefix plus bytes) of the
// BSON string at the start of b.
func stringSize(b []byte) (int, string) {
	if len(b) < 4 {
		return 0, "string truncated"
	}
	n := int(int32(le.Uint32(b)))
	if n < 1 || n > len(b)-4 {
		return 0, "string length out of range"
	}
	if b[4+n-1] != 0 {
		return 0, "string not NUL-terminated"
	}
	return 4 + n, ""
}

// CommandName returns the first key of a command body, which names the
// command. It returns "" for an empty or malformed document. For the
// commands a pooler sees all the time the result is a shared constant and
// nothing is allocated; other names are copied, so the result never aliases
// body and stays valid after the message buffer is reused.
func CommandName(body bsoncore.Document) string {
	key := firstKey(body)
	if key == nil {
		return ""
	}
	return intern(key)
}

// firstKey returns the first element key of doc, aliasing doc, or nil.
func firstKey(doc []byte) []byte {
	if len(doc) < 5 {
		return nil
	}
	n := int(int32(le.Uint32(doc)))
	if n < 5 || n > len(doc) {
		return nil
	}
	doc = doc[:n-1]
	if len(doc) < 5 || doc[4] == 0 {
		return nil
	}
	k := bytes.IndexByte(doc[5:], 0)
	if k < 0 {
		return nil
	}
	return doc[5 : 5+k]
}

// internTable maps well-known command names, sequence identifiers and
// namespaces to shared strings. A lookup keyed by string(b) compiles to a
// non-allocating map access.
var internTable = func() map[string]string {
	names := []string{
		// CRUD and cursors.
		"find", "insert", "update", "delete", "aggregate", "getMore", "killCursors", "count", "distinct",
		"findAndModify", "findandmodify", "bulkWrite", "explain", "mapReduce", "geoNear",
		// Sessions and transactions.
		"endSessions", "startSession", "refreshSessions", "killSessions", "killAllSessions",
		"killAllSessionsByPattern", "commitTransaction", "abortTransaction",
		// Handshake, monitoring, auth.
		"hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "saslStart", "saslContinue",
		"authenticate", "getnonce", "logout", "connectionStatus", "whatsmyuri", "serverStatus", "hostInfo",
		"getParameter", "setParameter", "getCmdLineOpts", "getLog", "currentOp", "killOp", "listCommands",
		"getLastError", "getlasterror", "replSetGetStatus", "dbStats", "collStats", "dataSize",
		// DDL and admin.
		"create", "drop", "dropDatabase", "createIndexes", "dropIndexes", "listIndexes", "listCollections",
		"listDatabases", "renameCollection", "collMod", "validate", "compact", "reIndex", "fsync", "shutdown",
		"createUser", "updateUser", "dropUser", "usersInfo", "createRole", "updateRole", "dropRole", "rolesInfo",
		"grantRolesToUser", "revokeRolesFromUser", "copydb", "copydbgetnonce", "copydbSaslStart",
		"createSearchIndexes", "updateSearchIndex", "dropSearchIndex", "listSearchIndexes",
		"shardCollection", "enableSharding", "addShard", "removeShard", "listShards", "balancerStatus",
		"flushRouterConfig", "clearJumboFlag", "moveChunk", "split", "configureFailPoint",
		// Reply bodies and legacy wrappers.
		"ok", "cursor", "n", "isWritablePrimary", "helloOk", "topologyVersion", "$query", "query",
		// OP_MSG sequence identifiers.
		"documents", "updates", "deletes", "ops", "nsInfo",
		// Legacy namespace.
		"admin.$cmd",
	}
	m := make(map[string]string, len(names))
	for _, s := range names {
		m[s] = s
	}
	return m
}()

// intern returns a string equal to b without allocating when b is a
// well-known name.
func intern(b []byte) string {
	if s, ok := internTable[string(b)]; ok {
		return s
	}
	return string(b)
}
