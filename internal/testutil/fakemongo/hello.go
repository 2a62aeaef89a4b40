package fakemongo

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// isHello reports whether cmd is one of the handshake command names.
func isHello(cmd string) bool {
	return cmd == "hello" || cmd == "isMaster" || cmd == "ismaster"
}

// helloAppName returns client.application.name from a hello body.
func helloAppName(body bsoncore.Document) (string, bool) {
	v, err := body.LookupErr("client", "application", "name")
	if err != nil {
		return "", false
	}
	return v.StringValueOK()
}

// negotiateCompression returns the compressors of the hello's compression
// list that the server accepts, in the client's order.
func (s *Server) negotiateCompression(body bsoncore.Document) []string {
	if len(s.opts.Compressors) == 0 {
		return nil
	}
	arr, ok := body.Lookup("compression").ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		return nil
	}
	var agreed []string
	for _, v := range vals {
		name, ok := v.StringValueOK()
		if !ok {
			continue
		}
		for _, allowed := range s.opts.Compressors {
			if name == allowed {
				agreed = append(agreed, allowed)
				break
			}
		}
	}
	return agreed
}

// topologyVersion returns the counter hello reports now.
func (s *Server) topologyVersion() int64 { return s.topoCounter.Load() }

// appendHello appends the built-in hello reply for req. cmd selects the
// primary flag's name (isWritablePrimary for hello, ismaster otherwise);
// compressors are the ones agreed with the connection (nil if the request
// did not ask for compression); counter is the topologyVersion counter to
// report.
func (s *Server) appendHello(dst []byte, req *Request, compressors []string, counter int64) []byte {
	o := &s.opts
	idx, dst := bsoncore.AppendDocumentStart(dst)
	writable := !(o.Kind == ReplicaSetMember && o.Secondary)
	var view *memberView
	if s.member != nil {
		view = s.member.view()
		writable = view.state == StatePrimary
	}
	if req.Command == "hello" {
		dst = bsoncore.AppendBooleanElement(dst, "isWritablePrimary", writable)
	} else {
		dst = bsoncore.AppendBooleanElement(dst, "ismaster", writable)
	}
	if ok, _ := req.Lookup("helloOk").BooleanOK(); ok {
		dst = bsoncore.AppendBooleanElement(dst, "helloOk", true)
	}
	if o.TopologyVersion {
		var tidx int32
		tidx, dst = bsoncore.AppendDocumentElementStart(dst, "topologyVersion")
		dst = bsoncore.AppendObjectIDElement(dst, "processId", s.processID)
		dst = bsoncore.AppendInt64Element(dst, "counter", counter)
		dst = endDoc(dst, tidx)
	}
	switch o.Kind {
	case Mongos:
		dst = bsoncore.AppendStringElement(dst, "msg", "isdbgrid")
	case ReplicaSetMember:
		if view != nil {
			dst = view.appendHello(dst)
			break
		}
		var aidx int32
		aidx, dst = bsoncore.AppendArrayElementStart(dst, "hosts")
		for i, h := range o.Hosts {
			dst = bsoncore.AppendStringElement(dst, arrayKey(i), h)
		}
		dst = endDoc(dst, aidx)
		dst = bsoncore.AppendStringElement(dst, "setName", o.SetName)
		dst = bsoncore.AppendInt32Element(dst, "setVersion", 1)
		dst = bsoncore.AppendBooleanElement(dst, "secondary", o.Secondary)
		if o.Primary != "" {
			dst = bsoncore.AppendStringElement(dst, "primary", o.Primary)
		}
		dst = bsoncore.AppendStringElement(dst, "me", s.addr)
		if !o.Secondary {
			dst = bsoncore.AppendObjectIDElement(dst, "electionId", s.processID)
		}
	}
	dst = bsoncore.AppendInt32Element(dst, "maxBsonObjectSize", o.MaxBSONObjectSize)
	dst = bsoncore.AppendInt32Element(dst, "maxMessageSizeBytes", o.MaxMessageSizeBytes)
	dst = bsoncore.AppendInt32Element(dst, "maxWriteBatchSize", o.MaxWriteBatchSize)
	dst = bsoncore.AppendDateTimeElement(dst, "localTime", time.Now().UnixMilli())
	if o.LogicalSessionTimeoutMinutes > 0 {
		dst = bsoncore.AppendInt32Element(dst, "logicalSessionTimeoutMinutes", o.LogicalSessionTimeoutMinutes)
	}
	dst = bsoncore.AppendInt64Element(dst, "connectionId", req.ConnID)
	dst = bsoncore.AppendInt32Element(dst, "minWireVersion", o.MinWireVersion)
	dst = bsoncore.AppendInt32Element(dst, "maxWireVersion", o.MaxWireVersion)
	dst = bsoncore.AppendBooleanElement(dst, "readOnly", false)
	if len(compressors) > 0 {
		var aidx int32
		aidx, dst = bsoncore.AppendArrayElementStart(dst, "compression")
		for i, c := range compressors {
			dst = bsoncore.AppendStringElement(dst, arrayKey(i), c)
		}
		dst = endDoc(dst, aidx)
	}
	if lb, _ := req.Lookup("loadBalanced").BooleanOK(); lb && o.LoadBalanced {
		dst = bsoncore.AppendObjectIDElement(dst, "serviceId", s.serviceID)
	}
	dst = s.appendHelloAuth(dst, req)
	dst = append(dst, s.helloTail...)
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	return endDoc(dst, idx)
}
