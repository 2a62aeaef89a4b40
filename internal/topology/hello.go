package topology

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// helloReply is the subset of a hello reply that describes a server. The
// upstream package parses the handshake reply but does not export its
// parser, so monitoring checks after the handshake decode here, into the
// same upstream.Hello type.
type helloReply struct {
	IsWritablePrimary            bool                  `bson:"isWritablePrimary"`
	IsMaster                     bool                  `bson:"ismaster"`
	Secondary                    bool                  `bson:"secondary"`
	ArbiterOnly                  bool                  `bson:"arbiterOnly"`
	ReadOnly                     bool                  `bson:"readOnly"`
	HelloOk                      bool                  `bson:"helloOk"`
	Msg                          string                `bson:"msg"`
	SetName                      string                `bson:"setName"`
	Hosts                        []string              `bson:"hosts"`
	Passives                     []string              `bson:"passives"`
	Arbiters                     []string              `bson:"arbiters"`
	Primary                      string                `bson:"primary"`
	Me                           string                `bson:"me"`
	MinWireVersion               int32                 `bson:"minWireVersion"`
	MaxWireVersion               int32                 `bson:"maxWireVersion"`
	MaxBSONObjectSize            int32                 `bson:"maxBsonObjectSize"`
	MaxMessageSizeBytes          int32                 `bson:"maxMessageSizeBytes"`
	MaxWriteBatchSize            int32                 `bson:"maxWriteBatchSize"`
	LogicalSessionTimeoutMinutes *int32                `bson:"logicalSessionTimeoutMinutes"`
	ConnectionID                 int64                 `bson:"connectionId"`
	ServiceID                    *bson.ObjectID        `bson:"serviceId"`
	TopologyVersion              *helloTopologyVersion `bson:"topologyVersion"`
}

type helloTopologyVersion struct {
	ProcessID bson.ObjectID `bson:"processId"`
	Counter   int64         `bson:"counter"`
}

// parseHello decodes a hello reply received on the monitoring connection.
// Negotiated, per-connection fields (compression, SASL mechanisms) are not in
// a plain hello reply; they are taken from the connection's handshake
// reply hs so that the result describes the server as completely as the
// handshake did. raw is retained.
func parseHello(raw bsoncore.Document, hs *upstream.Hello) (*upstream.Hello, error) {
	var r helloReply
	if err := bson.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("topology: hello reply: %w", err)
	}
	h := &upstream.Hello{
		IsWritablePrimary:            r.IsWritablePrimary || r.IsMaster,
		Secondary:                    r.Secondary,
		ArbiterOnly:                  r.ArbiterOnly,
		ReadOnly:                     r.ReadOnly,
		HelloOk:                      r.HelloOk,
		Msg:                          r.Msg,
		SetName:                      r.SetName,
		Hosts:                        r.Hosts,
		Passives:                     r.Passives,
		Arbiters:                     r.Arbiters,
		Primary:                      r.Primary,
		Me:                           r.Me,
		MinWireVersion:               r.MinWireVersion,
		MaxWireVersion:               r.MaxWireVersion,
		MaxBSONObjectSize:            r.MaxBSONObjectSize,
		MaxMessageSizeBytes:          r.MaxMessageSizeBytes,
		MaxWriteBatchSize:            r.MaxWriteBatchSize,
		LogicalSessionTimeoutMinutes: r.LogicalSessionTimeoutMinutes,
		ConnectionID:                 r.ConnectionID,
		Raw:                          raw,
	}
	if r.ServiceID != nil {
		h.ServiceID, h.HasServiceID = *r.ServiceID, true
	}
	if r.TopologyVersion != nil {
		h.TopologyVersion = &upstream.TopologyVersion{ProcessID: r.TopologyVersion.ProcessID, Counter: r.TopologyVersion.Counter}
	}
	if hs != nil {
		h.Compression = slices.Clone(hs.Compression)
		h.SaslSupportedMechs = slices.Clone(hs.SaslSupportedMechs)
		if !h.HasServiceID {
			h.ServiceID, h.HasServiceID = hs.ServiceID, hs.HasServiceID
		}
	}
	return h, nil
}
