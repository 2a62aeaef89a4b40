// The event comparison of the SDAM monitoring suite: the events a phase
// published must be exactly the expected ones, in order, each description
// matching the fields the file gives (absent setName and primary mean none).

package sdam

import (
	"encoding/json"
	"testing"
)

var specEventTypes = map[string]EventType{
	"topology_opening_event":             TopologyOpening,
	"server_opening_event":               ServerOpening,
	"server_description_changed_event":   ServerDescriptionChanged,
	"server_closed_event":                ServerClosed,
	"topology_description_changed_event": TopologyDescriptionChanged,
}

func checkEvents(t *testing.T, phase int, raw json.RawMessage, got []Event) {
	t.Helper()
	var want []map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	names := func() (g []string) {
		for _, e := range got {
			g = append(g, e.Type.String()+" "+e.Address)
		}
		return g
	}
	if len(got) != len(want) {
		t.Errorf("phase %d: %d events %v, want %d", phase, len(got), names(), len(want))
		return
	}
	for i, w := range want {
		if len(w) != 1 {
			t.Fatalf("phase %d event %d: %d keys", phase, i, len(w))
		}
		for name, fields := range w {
			typ, ok := specEventTypes[name]
			if !ok {
				t.Fatalf("phase %d event %d: unknown event %q", phase, i, name)
			}
			if got[i].Type != typ {
				t.Errorf("phase %d event %d: %s, want %s (all: %v)", phase, i, got[i].Type, typ, names())
				continue
			}
			checkEvent(t, phase, i, got[i], fields)
		}
	}
}

func checkEvent(t *testing.T, phase, i int, e Event, fields map[string]json.RawMessage) {
	t.Helper()
	for key, raw := range fields {
		switch key {
		case "topologyId":
			// "42": any value; this package has one topology per value.
		case "address":
			if got, want := e.Address, jsonString(t, raw); got != want {
				t.Errorf("phase %d event %d: address %s, want %s", phase, i, got, want)
			}
		case "previousDescription", "newDescription":
			var desc map[string]json.RawMessage
			if err := json.Unmarshal(raw, &desc); err != nil {
				t.Fatal(err)
			}
			if e.Type == TopologyDescriptionChanged {
				td := e.NewTopology
				if key == "previousDescription" {
					td = e.PreviousTopology
				}
				checkEventTopology(t, phase, i, key, td, desc)
			} else {
				sd := e.NewServer
				if key == "previousDescription" {
					sd = e.PreviousServer
				}
				checkEventServer(t, phase, i, key, sd, desc)
			}
		default:
			t.Errorf("phase %d event %d: key %q not checked by this runner", phase, i, key)
		}
	}
}

func checkEventTopology(t *testing.T, phase, i int, which string, td TopologyDescription, desc map[string]json.RawMessage) {
	t.Helper()
	if got, want := td.SetName, jsonString(t, desc["setName"]); got != want {
		t.Errorf("phase %d event %d %s: setName %q, want %q", phase, i, which, got, want)
	}
	for key, raw := range desc {
		switch key {
		case "setName":
		case "topologyType":
			if got, want := td.Type.String(), jsonString(t, raw); got != want {
				t.Errorf("phase %d event %d %s: topologyType %s, want %s", phase, i, which, got, want)
			}
		case "servers":
			var servers []map[string]json.RawMessage
			if err := json.Unmarshal(raw, &servers); err != nil {
				t.Fatal(err)
			}
			if len(servers) != len(td.Servers) {
				t.Errorf("phase %d event %d %s: %d servers, want %d", phase, i, which, len(td.Servers), len(servers))
				continue
			}
			for _, s := range servers {
				addr := jsonString(t, s["address"])
				sd, ok := td.Server(addr)
				if !ok {
					t.Errorf("phase %d event %d %s: no server %s", phase, i, which, addr)
					continue
				}
				checkEventServer(t, phase, i, which+" "+addr, sd, s)
			}
		default:
			t.Errorf("phase %d event %d %s: key %q not checked by this runner", phase, i, which, key)
		}
	}
}

func checkEventServer(t *testing.T, phase, i int, which string, sd ServerDescription, desc map[string]json.RawMessage) {
	t.Helper()
	for _, key := range []string{"setName", "primary"} {
		got := sd.SetName
		if key == "primary" {
			got = sd.Primary
		}
		if want := jsonString(t, desc[key]); got != want {
			t.Errorf("phase %d event %d %s: %s %q, want %q", phase, i, which, key, got, want)
		}
	}
	for key, raw := range desc {
		switch key {
		case "setName", "primary":
		case "address":
			if got, want := sd.Address, jsonString(t, raw); got != want {
				t.Errorf("phase %d event %d %s: address %s, want %s", phase, i, which, got, want)
			}
		case "type":
			if got, want := sd.Type.String(), jsonString(t, raw); got != want {
				t.Errorf("phase %d event %d %s: type %s, want %s", phase, i, which, got, want)
			}
		case "hosts", "passives", "arbiters":
			var want []string
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{"hosts": sd.Hosts, "passives": sd.Passives, "arbiters": sd.Arbiters}[key]
			if !sameSet(got, want) {
				t.Errorf("phase %d event %d %s: %s %v, want %v", phase, i, which, key, got, want)
			}
		default:
			t.Errorf("phase %d event %d %s: key %q not checked by this runner", phase, i, which, key)
		}
	}
}
