package deploytest

// The manifests against mongobouncer: the configuration each Deployment
// mounts is accepted by `mongobouncer --check`, the real binary answers
// its probe paths on the port the probes use, the ports agree with the
// configuration, and the grace period covers the configured drain.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	toml "github.com/pelletier/go-toml/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// binary is bin/mongobouncer built by TestMain from this checkout.
var binary string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "deploytest")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "mongobouncer")
		gocmd := os.Getenv("GO")
		if gocmd == "" {
			gocmd = "go"
		}
		build := exec.Command(gocmd, "build", "-o", binary, "./cmd/mongobouncer")
		build.Dir = filepath.Join("..", "..")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building mongobouncer:", err)
			return 1
		}
		return m.Run()
	}())
}

// mounted is what a Deployment gives its mongobouncer container: the
// files of the volume holding its configuration (path relative to the
// mount → contents), the configuration's path in that volume, and the
// configuration's [mongobouncer] table.
type mounted struct {
	files  map[string][]byte
	config string
	global map[string]any
}

// mountedConfig follows c's --config argument to its volume and reads the
// volume's files from the ConfigMaps and Secrets in objs (a missing
// optional source is left out, as the kubelet does).
func mountedConfig(t *testing.T, objs []object, d *appsv1.Deployment, c *corev1.Container) mounted {
	t.Helper()
	var cfgPath string
	for i, a := range c.Args {
		if a == "--config" && i+1 < len(c.Args) {
			cfgPath = c.Args[i+1]
		}
	}
	if cfgPath == "" {
		t.Fatalf("Deployment %s: container %s has no --config FILE argument", d.Name, c.Name)
	}
	var vm *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		if strings.HasPrefix(cfgPath, m.MountPath+"/") {
			vm = m
		}
	}
	if vm == nil {
		t.Fatalf("Deployment %s: no volume mounted where --config %s is", d.Name, cfgPath)
	}
	if !vm.ReadOnly {
		t.Errorf("Deployment %s: volume %s is not mounted readOnly", d.Name, vm.Name)
	}
	var vol *corev1.Volume
	for i := range d.Spec.Template.Spec.Volumes {
		if d.Spec.Template.Spec.Volumes[i].Name == vm.Name {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("Deployment %s: no volume %s", d.Name, vm.Name)
	}
	var sources []corev1.VolumeProjection
	switch {
	case vol.ConfigMap != nil:
		sources = []corev1.VolumeProjection{{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: vol.ConfigMap.LocalObjectReference, Items: vol.ConfigMap.Items, Optional: vol.ConfigMap.Optional}}}
	case vol.Projected != nil:
		sources = vol.Projected.Sources
	default:
		t.Fatalf("Deployment %s: volume %s is neither a ConfigMap nor projected", d.Name, vol.Name)
	}
	maps, _ := only[*corev1.ConfigMap](objs)
	secrets, _ := only[*corev1.Secret](objs)
	files := map[string][]byte{}
	add := func(kind, name string, optional *bool, items []corev1.KeyToPath, data map[string][]byte, found bool) {
		if !found {
			if optional == nil || !*optional {
				t.Errorf("Deployment %s: %s %s is not in the manifests and not optional", d.Name, kind, name)
			}
			return
		}
		if len(items) == 0 {
			for k, v := range data {
				files[k] = v
			}
		}
		for _, it := range items {
			v, ok := data[it.Key]
			if !ok {
				t.Errorf("Deployment %s: %s %s has no key %s", d.Name, kind, name, it.Key)
			}
			files[it.Path] = v
		}
	}
	for _, s := range sources {
		switch {
		case s.ConfigMap != nil:
			data, found := map[string][]byte{}, false
			for _, m := range maps {
				if m.Name == s.ConfigMap.Name {
					found = true
					for k, v := range m.Data {
						data[k] = []byte(v)
					}
				}
			}
			add("ConfigMap", s.ConfigMap.Name, s.ConfigMap.Optional, s.ConfigMap.Items, data, found)
		case s.Secret != nil:
			data, found := map[string][]byte{}, false
			for _, sec := range secrets {
				if sec.Name == s.Secret.Name {
					found = true
					for k, v := range sec.Data {
						data[k] = v
					}
					for k, v := range sec.StringData {
						data[k] = []byte(v)
					}
				}
			}
			add("Secret", s.Secret.Name, s.Secret.Optional, s.Secret.Items, data, found)
		default:
			t.Errorf("Deployment %s: volume %s has a source this test does not read", d.Name, vol.Name)
		}
	}
	rel := strings.TrimPrefix(cfgPath, vm.MountPath+"/")
	text, ok := files[rel]
	if !ok {
		t.Fatalf("Deployment %s: volume %s has no %s", d.Name, vol.Name, rel)
	}
	var doc map[string]any
	if err := toml.Unmarshal(text, &doc); err != nil {
		t.Fatalf("Deployment %s: %s: %v", d.Name, rel, err)
	}
	global, _ := doc["mongobouncer"].(map[string]any)
	return mounted{files: files, config: rel, global: global}
}

// write puts the volume's files in a new directory and returns the
// configuration's path there (mode 0600, as on a host).
func (m mounted) write(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for p, b := range m.files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, filepath.FromSlash(m.config))
}

// duration is a duration key of [mongobouncer], which must be set: the
// grace period arithmetic is only checkable against values in the file.
func (m mounted) duration(t *testing.T, key string) time.Duration {
	t.Helper()
	s, ok := m.global[key].(string)
	if !ok {
		t.Fatalf("the configuration does not set %s: set it, so that the grace period can be checked against it", key)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s = %q: %v", key, s, err)
	}
	return d
}

// port is the port of the address key of [mongobouncer], and whether its
// host lets the kubelet in (not loopback; "" is loopback for admin_listen).
func (m mounted) port(t *testing.T, key string) (int32, bool) {
	t.Helper()
	s, _ := m.global[key].(string)
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatalf("%s = %q: %v", key, s, err)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		t.Fatalf("%s = %q: not a fixed port", key, s)
	}
	ip := net.ParseIP(host)
	return int32(n), ip != nil && ip.IsUnspecified()
}

// TestDeployments checks each Deployment's mongobouncer container against
// its own configuration and against the running binary.
func TestDeployments(t *testing.T) {
	objs := loadAll(t)
	ks, _ := only[*kustomization](objs)
	if len(ks) != 1 || len(ks[0].Images) != 1 {
		t.Fatal("kustomization.yaml with one images: entry needed (TestKustomizationListsEveryManifest)")
	}
	deps, files := only[*appsv1.Deployment](objs)
	if !hasFile(files, "deployment.yaml") || !hasFile(files, "sidecar-example.yaml") {
		t.Fatalf("Deployments in %v, want deployment.yaml and sidecar-example.yaml", files)
	}
	monitors, _ := only[*podMonitor](objs)
	for i, d := range deps {
		t.Run(files[i]+"/"+d.Name, func(t *testing.T) {
			c, sidecar := mongobouncerContainer(t, d, ks[0].Images[0].Name)
			if c == nil {
				t.Fatal("no mongobouncer container")
			}
			if files[i] == "deployment.yaml" && (d.Spec.Replicas == nil || *d.Spec.Replicas != 2) {
				t.Errorf("replicas %s, want 2", deref(d.Spec.Replicas))
			}
			m := mountedConfig(t, objs, d, c)
			checkSecurity(t, d, c)
			checkResources(t, c)
			checkPorts(t, m, c, sidecar)
			checkGrace(t, m, d, c, sidecar)
			cfg := m.write(t)
			checkConfig(t, cfg)
			var metricsPaths []string
			for _, pm := range monitors {
				if selects(&pm.Spec.Selector, d.Spec.Template.Labels) {
					for _, ep := range pm.Spec.PodMetricsEndpoints {
						if _, ok := containerPort(c, ep.Port, 0); !ok {
							t.Errorf("PodMonitor %s: port %q is not a port of container %s", pm.Metadata.Name, ep.Port, c.Name)
						}
						metricsPaths = append(metricsPaths, ep.Path)
					}
				}
			}
			checkProbesAnswered(t, cfg, c, metricsPaths)
		})
	}
}

func checkSecurity(t *testing.T, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("no securityContext")
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	if !isTrue(sc.RunAsNonRoot) || sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("runAsNonRoot %s runAsUser %s, want true and 65532 (the image's user)", deref(sc.RunAsNonRoot), deref(sc.RunAsUser))
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || len(sc.Capabilities.Add) > 0 {
		t.Errorf("capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && d.Spec.Template.Spec.SecurityContext != nil {
		seccomp = d.Spec.Template.Spec.SecurityContext.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %+v, want RuntimeDefault", seccomp)
	}
}

func checkResources(t *testing.T, c *corev1.Container) {
	t.Helper()
	r := c.Resources
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := r.Requests[name]; !ok || q.IsZero() {
			t.Errorf("no %s request", name)
		}
	}
	if q, ok := r.Limits[corev1.ResourceMemory]; !ok || q.Cmp(r.Requests[corev1.ResourceMemory]) < 0 {
		t.Errorf("memory limit %v below the request or missing", q.String())
	}
}

// checkPorts: the probes use the admin port, which is admin_listen's on
// every interface, and the "mongodb" port is listen's.
func checkPorts(t *testing.T, m mounted, c *corev1.Container, sidecar bool) {
	t.Helper()
	adminPort, open := m.port(t, "admin_listen")
	if !open {
		t.Errorf("admin_listen = %q: the kubelet's probes come to the pod's address, so it must be 0.0.0.0:PORT or [::]:PORT", m.global["admin_listen"])
	}
	for _, p := range []struct {
		what  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s is not an httpGet probe", p.what)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s path %q, want %q", p.what, p.probe.HTTPGet.Path, p.path)
		}
		port, ok := containerPort(c, p.probe.HTTPGet.Port.StrVal, p.probe.HTTPGet.Port.IntVal)
		if !ok || port != adminPort {
			t.Errorf("%s port %s is container port %d, admin_listen's is %d", p.what, p.probe.HTTPGet.Port.String(), port, adminPort)
		}
	}
	listenPort, open := m.port(t, "listen")
	if sidecar {
		if open {
			t.Errorf("listen = %q: a sidecar serves its pod only, on loopback", m.global["listen"])
		}
		return
	}
	if !open {
		t.Errorf("listen = %q: the Service reaches the pod's address", m.global["listen"])
	}
	if port, ok := containerPort(c, "mongodb", 0); !ok || port != listenPort {
		t.Errorf("container port \"mongodb\" %d, listen's port %d", port, listenPort)
	}
}

// checkGrace: the grace period covers the longest preStop sleep,
// shutdown_delay, the drain
// (shutdown_timeout), the clients' disconnection (upstream_command_timeout
// + 1 s) and 5 s for closing the pools (docs/operations.md "Signals").
func checkGrace(t *testing.T, m mounted, d *appsv1.Deployment, c *corev1.Container, sidecar bool) {
	t.Helper()
	spec := d.Spec.Template.Spec
	var preStop int64
	for _, ct := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if ct.Lifecycle == nil || ct.Lifecycle.PreStop == nil {
			continue
		}
		h := ct.Lifecycle.PreStop
		if ct.Image == c.Image && h.Sleep == nil {
			t.Errorf("container %s: preStop must be a sleep action: the image has no shell for exec", ct.Name)
		}
		if h.Sleep != nil {
			preStop = max(preStop, h.Sleep.Seconds)
		}
	}
	if !sidecar && (c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 5) {
		t.Error("no preStop sleep of at least 5 s: SIGTERM would come before the pod is out of the Service's endpoints")
	}
	// shutdown_delay (optional: 0 when unset) comes before the drain.
	var delay time.Duration
	if _, ok := m.global["shutdown_delay"]; ok {
		delay = m.duration(t, "shutdown_delay")
	}
	need := time.Duration(preStop)*time.Second + delay + m.duration(t, "shutdown_timeout") + m.duration(t, "upstream_command_timeout") + time.Second + 5*time.Second
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %s, need at least %v (preStop %d s + shutdown_delay + shutdown_timeout + upstream_command_timeout + 1 s + 5 s)", deref(spec.TerminationGracePeriodSeconds), need, preStop)
	}
}

// deref formats an optional field.
func deref[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

// checkConfig: mongobouncer --check accepts the configuration as mounted.
func checkConfig(t *testing.T, cfg string) {
	t.Helper()
	out, err := exec.Command(binary, "--config", cfg, "--check").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "configuration ok" {
		t.Errorf("mongobouncer --check: %v\n%s", err, out)
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// checkProbesAnswered runs the binary with the mounted configuration (its
// listeners moved to free loopback ports, its upstream to a closed port)
// and fetches the probes' paths: liveness 200 though the upstream is down,
// readiness 503 naming the route, and any metrics path 200.
func checkProbesAnswered(t *testing.T, cfg string, c *corev1.Container, metricsPaths []string) {
	t.Helper()
	admin := freeAddr(t)
	cmd := exec.Command(binary, "--config", cfg, "--listen", freeAddr(t), "--admin-listen", admin, "--upstream", "mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=1000")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("mongobouncer did not exit 0 on SIGTERM: %v\n%s", err, logs.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("mongobouncer still running 20 s after SIGTERM\n%s", logs.String())
		}
	}()
	client := &http.Client{Timeout: 3 * time.Second}
	get := func(p string) (int, string, error) {
		resp, err := client.Get("http://" + admin + path.Clean("/"+p))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b), err
	}
	live := c.LivenessProbe.HTTPGet.Path
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body, err := get(live)
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %q %v\n%s", live, code, body, err, logs.String())
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("mongobouncer exited: %v\n%s", err, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	ready := c.ReadinessProbe.HTTPGet.Path
	if code, body, err := get(ready); err != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, `route "*"`) {
		t.Errorf("GET %s with the upstream down: %d %q %v, want 503 naming the route", ready, code, body, err)
	}
	for _, p := range metricsPaths {
		if code, body, err := get(p); err != nil || code != http.StatusOK || !strings.Contains(body, "mongobouncer_") {
			t.Errorf("GET %s: %d %v, want 200 with mongobouncer_ series", p, code, err)
		}
	}
}

// TestServicePDBAndNetworkPolicy: the Service, the PodDisruptionBudget and
// the NetworkPolicy select the Deployment's pods and name its ports, and
// the policy admits the unauthenticated admin port from a chosen source
// only.
func TestServicePDBAndNetworkPolicy(t *testing.T) {
	objs := loadAll(t)
	ks, _ := only[*kustomization](objs)
	deps, files := only[*appsv1.Deployment](objs)
	var d *appsv1.Deployment
	for i := range deps {
		if files[i] == "deployment.yaml" {
			d = deps[i]
		}
	}
	if d == nil || len(ks) != 1 || len(ks[0].Images) != 1 {
		t.Fatal("deployment.yaml and kustomization.yaml needed")
	}
	c, _ := mongobouncerContainer(t, d, ks[0].Images[0].Name)
	if c == nil {
		t.Fatal("no mongobouncer container")
	}
	pod := d.Spec.Template.Labels
	if !selects(d.Spec.Selector, pod) {
		t.Error("the Deployment's selector does not select its own pods")
	}

	svcs, svcFiles := only[*corev1.Service](objs)
	if len(svcs) != 1 || svcFiles[0] != "service.yaml" {
		t.Fatalf("Services %v, want one in service.yaml", svcFiles)
	}
	svc := svcs[0]
	if len(svc.Spec.Selector) == 0 || !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod) {
		t.Error("the Service does not select the Deployment's pods")
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 27017 {
		t.Errorf("Service ports %+v, want 27017", svc.Spec.Ports)
	} else if tp := svc.Spec.Ports[0].TargetPort; !func() bool { _, ok := containerPort(c, tp.StrVal, tp.IntVal); return ok }() {
		t.Errorf("Service targetPort %s is not a port of the container", tp.String())
	}

	pdbs, _ := only[*policyv1.PodDisruptionBudget](objs)
	if len(pdbs) != 1 || !selects(pdbs[0].Spec.Selector, pod) {
		t.Fatal("want one PodDisruptionBudget selecting the Deployment's pods")
	}
	pdb := pdbs[0].Spec
	switch {
	case pdb.MaxUnavailable != nil && pdb.MinAvailable == nil:
		if v := pdb.MaxUnavailable.IntValue(); v < 1 || v >= int(*d.Spec.Replicas) {
			t.Errorf("maxUnavailable %s: want at least 1, below replicas", pdb.MaxUnavailable.String())
		}
	case pdb.MinAvailable != nil && pdb.MaxUnavailable == nil:
		if v := pdb.MinAvailable.IntValue(); v < 1 || v >= int(*d.Spec.Replicas) {
			t.Errorf("minAvailable %s: want at least 1, below replicas (else no node can drain)", pdb.MinAvailable.String())
		}
	default:
		t.Error("want one of maxUnavailable and minAvailable")
	}

	nps, _ := only[*networkingv1.NetworkPolicy](objs)
	var np *networkingv1.NetworkPolicy
	for _, p := range nps {
		if selects(&p.Spec.PodSelector, pod) {
			np = p
		}
	}
	if np == nil {
		t.Fatal("no NetworkPolicy selects the Deployment's pods")
	}
	adminPort, _ := containerPort(c, "admin", 0)
	var adminRules int
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil {
				t.Error("a rule admits every port")
				continue
			}
			port, ok := containerPort(c, p.Port.StrVal, p.Port.IntVal)
			if !ok {
				t.Errorf("NetworkPolicy port %s is not a port of the container", p.Port.String())
			}
			if port == adminPort {
				adminRules++
				if len(rule.From) == 0 {
					t.Error("the NetworkPolicy admits the admin port from everywhere: it is not authenticated")
				}
			}
		}
		if len(rule.Ports) == 0 {
			t.Error("a NetworkPolicy rule admits every port (the admin port included)")
		}
	}
	if adminRules == 0 {
		t.Error("the NetworkPolicy does not admit the admin port from anywhere: Prometheus cannot scrape it")
	}
}
