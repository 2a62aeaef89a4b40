package deploytest

// Decoding deploy/kubernetes: every YAML document into its Kubernetes API
// type with unknown and duplicate fields refused, and the kustomization's
// list of files against the directory.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// deployDir is deploy/kubernetes, from this package's directory.
var deployDir = filepath.Join("..", "..", "deploy", "kubernetes")

// kustomization is the part of kustomize's Kustomization these manifests
// use; any other field is refused by the strict decoding, so a field added
// to kustomization.yaml must be added here (and thought about).
type kustomization struct {
	metav1.TypeMeta `json:",inline"`
	Resources       []string `json:"resources"`
	Images          []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images"`
}

// podMonitor is the part of the Prometheus operator's PodMonitor
// (monitoring.coreos.com/v1) that podmonitor.yaml uses: k8s.io/api has no
// type for it, and the operator's module is too heavy to import for one
// struct. Fields are spelt as in the operator's CRD.
type podMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector            metav1.LabelSelector `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval,omitempty"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// object is one decoded YAML document.
type object struct {
	file string // base name
	kind string
	name string
	obj  any // *corev1.ConfigMap, *appsv1.Deployment, ...
}

// newObject returns the empty value a document of apiVersion and kind
// decodes into, or nil for a kind the test does not know (a failure: every
// manifest must be checked).
func newObject(apiVersion, kind string) any {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}
	case "v1 Secret":
		return &corev1.Secret{}
	case "v1 Service":
		return &corev1.Service{}
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "monitoring.coreos.com/v1 PodMonitor":
		return &podMonitor{}
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		return &kustomization{}
	}
	return nil
}

// splitDocuments splits a YAML stream at its "---" lines, dropping
// documents with nothing but comments.
func splitDocuments(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(b), -1) {
		for _, line := range strings.Split(d, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, []byte(d))
				break
			}
		}
	}
	return docs
}

// decodeDocument decodes one document strictly into its type.
func decodeDocument(doc []byte) (kind string, obj any, err error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, err
	}
	obj = newObject(tm.APIVersion, tm.Kind)
	if obj == nil {
		return "", nil, fmt.Errorf("apiVersion %q kind %q: no type known to this test", tm.APIVersion, tm.Kind)
	}
	// As the API server decodes: YAML to JSON refusing duplicate keys,
	// then case-sensitive JSON refusing unknown and duplicate fields.
	// (yaml.UnmarshalStrict decodes with encoding/json, whose field names
	// match case-insensitively: "readOnlyRootFileSystem" would pass, and
	// overwrite the correctly spelt one.)
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil && len(strict) > 0 {
		err = errors.Join(strict...)
	}
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return tm.Kind, obj, nil
}

// loadAll decodes every *.yaml of deploy/kubernetes.
func loadAll(t *testing.T) []object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", deployDir, err)
	}
	var objs []object
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range splitDocuments(b) {
			kind, obj, err := decodeDocument(doc)
			if err != nil {
				t.Fatalf("%s, document %d: %v", filepath.Base(f), i+1, err)
			}
			objs = append(objs, object{file: filepath.Base(f), kind: kind, name: objectName(obj), obj: obj})
		}
	}
	return objs
}

func objectName(obj any) string {
	if m, ok := obj.(metav1.Object); ok {
		return m.GetName()
	}
	if p, ok := obj.(*podMonitor); ok {
		return p.Metadata.Name
	}
	return ""
}

// only returns the objects of type T, with their files.
func only[T any](objs []object) (out []T, files []string) {
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			out = append(out, v)
			files = append(files, o.file)
		}
	}
	return out, files
}

// TestManifestsDecodeStrictly: every document of every manifest decodes
// into its API type, and the decoding is strict enough to catch a misspelt
// field (checked on a copy of deployment.yaml with one).
func TestManifestsDecodeStrictly(t *testing.T) {
	objs := loadAll(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.kind]++
	}
	for _, k := range []string{"Kustomization", "ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "PodMonitor"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in %s", k, deployDir)
		}
	}

	b, err := os.ReadFile(filepath.Join(deployDir, "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to string }{
		{"terminationGracePeriodSeconds:", "terminationGracePeriodSecond:"},
		{"readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true\n            readOnlyRootFilesystem: true"},
		{"    spec:\n", "    spec:\n      replicas: 3\n"}, // replicas belongs to the Deployment's spec, not the pod's
	} {
		bad := bytes.Replace(b, []byte(c.from), []byte(c.to), 1)
		if bytes.Equal(bad, b) {
			t.Fatalf("deployment.yaml has no %q to spoil", c.from)
		}
		if _, _, err := decodeDocument(bad); err == nil {
			t.Errorf("%q for %q decoded without an error: the decoding is not strict", c.to, c.from)
		}
	}
}

// commentedResource matches "# - file.yaml" in kustomization.yaml: a
// manifest left out on purpose (optional, or an example of its own).
var commentedResource = regexp.MustCompile(`(?m)^\s*#\s*-\s*([^\s#]+\.yaml)\b`)

// TestKustomizationListsEveryManifest: each manifest of the directory is a
// resource or a commented-out one, each resource exists, and the images:
// entry names the image every mongobouncer container uses.
func TestKustomizationListsEveryManifest(t *testing.T) {
	objs := loadAll(t)
	ks, _ := only[*kustomization](objs)
	if len(ks) != 1 {
		t.Fatalf("%d kustomizations, want 1", len(ks))
	}
	k := ks[0]
	raw, err := os.ReadFile(filepath.Join(deployDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, r := range k.Resources {
		listed[r] = "resource"
	}
	for _, m := range commentedResource.FindAllStringSubmatch(string(raw), -1) {
		if listed[m[1]] != "" {
			t.Errorf("%s is both a resource and commented out", m[1])
		}
		listed[m[1]] = "commented"
	}
	files, _ := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	for _, f := range files {
		name := filepath.Base(f)
		if name != "kustomization.yaml" && listed[name] == "" {
			t.Errorf("%s is not listed in kustomization.yaml (as a resource, or commented out with why)", name)
		}
	}
	for name, how := range listed {
		if _, err := os.Stat(filepath.Join(deployDir, name)); err != nil {
			t.Errorf("kustomization.yaml lists %s (%s), which does not exist", name, how)
		}
	}
	for _, want := range []string{"configmap.yaml", "secret.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "networkpolicy.yaml"} {
		if listed[want] != "resource" {
			t.Errorf("%s is not a resource of kustomization.yaml", want)
		}
	}

	if len(k.Images) != 1 || k.Images[0].Name == "" {
		t.Fatalf("kustomization.yaml needs one images: entry, for users to set the image; got %+v", k.Images)
	}
	deps, depFiles := only[*appsv1.Deployment](objs)
	for i, d := range deps {
		c, _ := mongobouncerContainer(t, d, k.Images[0].Name)
		if c == nil {
			t.Errorf("%s: Deployment %s has no container with image %s (the images: entry)", depFiles[i], d.Name, k.Images[0].Name)
		}
	}
}

// imageName is an image reference without its tag or digest.
func imageName(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}
	return ref
}

// mongobouncerContainer returns the container of d running image (a
// container or, for a sidecar, an init container with restartPolicy
// Always), and whether it is a sidecar.
func mongobouncerContainer(t *testing.T, d *appsv1.Deployment, image string) (*corev1.Container, bool) {
	t.Helper()
	spec := &d.Spec.Template.Spec
	for i := range spec.Containers {
		if imageName(spec.Containers[i].Image) == image {
			return &spec.Containers[i], false
		}
	}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if imageName(c.Image) == image {
			if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Errorf("Deployment %s: init container %s runs mongobouncer but is not a sidecar (restartPolicy: Always)", d.Name, c.Name)
			}
			return c, true
		}
	}
	return nil, false
}

// selects reports whether sel's matchLabels (the only form these manifests
// use) select labels.
func selects(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil || len(sel.MatchExpressions) > 0 || len(sel.MatchLabels) == 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// containerPort resolves a probe's or a Service's port (a name or a
// number) among c's ports.
func containerPort(c *corev1.Container, name string, number int32) (int32, bool) {
	for _, p := range c.Ports {
		if (name != "" && p.Name == name) || (name == "" && p.ContainerPort == number) {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

// hasFile reports whether files has name.
func hasFile(files []string, name string) bool { return slices.Contains(files, name) }

// TestKustomizeBuilds runs kustomize itself (kubectl's) on the directory,
// where kubectl is installed: the output decodes strictly, holds every
// resource, and its mongobouncer image is the images: entry's.
func TestKustomizeBuilds(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not installed: kustomize's own build not checked")
	}
	cmd := exec.Command(kubectl, "kustomize", deployDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, stderr.String())
	}
	objs := loadAll(t)
	ks, _ := only[*kustomization](objs)
	if len(ks) != 1 || len(ks[0].Images) != 1 {
		t.Fatal("kustomization.yaml with one images: entry needed")
	}
	img := ks[0].Images[0]
	want := img.NewName + ":" + img.NewTag
	built := map[string]bool{}
	for i, doc := range splitDocuments(out) {
		kind, obj, err := decodeDocument(doc)
		if err != nil {
			t.Fatalf("built document %d: %v", i+1, err)
		}
		built[kind+"/"+objectName(obj)] = true
		if d, ok := obj.(*appsv1.Deployment); ok {
			n := 0
			for _, c := range d.Spec.Template.Spec.Containers {
				if c.Name == "mongobouncer" {
					n++
					if c.Image != want {
						t.Errorf("built image %s, want %s (the images: entry)", c.Image, want)
					}
				}
			}
			if n != 1 {
				t.Errorf("built Deployment %s has %d containers named mongobouncer, want 1", d.Name, n)
			}
		}
	}
	for _, o := range objs {
		if slices.Contains(ks[0].Resources, o.file) && !built[o.kind+"/"+o.name] {
			t.Errorf("%s %s of %s is not in kustomize's output", o.kind, o.name, o.file)
		}
	}
}
