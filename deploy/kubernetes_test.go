package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kustomize "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

const (
	kubernetesDir     = "kubernetes"
	kustomizationName = "kustomization.yaml"
)

// k8sObject is one document of a manifest, decoded into its API type.
type k8sObject struct {
	file string
	kind string
	name string
	obj  runtime.Object
}

// k8sDecoder decodes manifests into the API types of apps/v1, v1 and
// policy/v1 strictly, as the API server does for `kubectl apply
// --validate=strict`: an unknown or duplicate field is an error, and so is a
// value of the wrong type. (Value constraints the API server checks after
// decoding, such as a valid restartPolicy, are the cross-checks' business.)
var k8sDecoder = sync.OnceValue(func() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
})

// loadKubernetes decodes every document of dir/kubernetes/*.yaml but the
// kustomization.
func loadKubernetes(ps *problems, dir string) []k8sObject {
	files, _ := filepath.Glob(filepath.Join(dir, kubernetesDir, "*.yaml"))
	var objs []k8sObject
	for _, file := range files {
		if filepath.Base(file) == kustomizationName {
			continue
		}
		data, ok := readFile(ps, file)
		if !ok {
			continue
		}
		// The YAML stream splitter kubectl uses.
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 1; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				ps.add("%s: document %d: %v", file, i, err)
				break
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err == nil && tm.Kind == "" && tm.APIVersion == "" && !hasContent(doc) {
				continue // only comments
			}
			obj, gvk, err := k8sDecoder().Decode(doc, nil, nil)
			if err != nil {
				ps.add("%s: document %d (%s %s): %v", file, i, tm.APIVersion, tm.Kind, err)
				continue
			}
			m, err := metaOf(obj)
			if err != nil || m.GetName() == "" {
				ps.add("%s: document %d (%s) has no metadata.name", file, i, gvk.Kind)
				continue
			}
			objs = append(objs, k8sObject{file: file, kind: gvk.Kind, name: m.GetName(), obj: obj})
		}
	}
	if len(objs) == 0 {
		ps.add("%s: no Kubernetes objects", filepath.Join(dir, kubernetesDir))
	}
	return objs
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	if m, ok := obj.(metav1.Object); ok {
		return m, nil
	}
	return nil, fmt.Errorf("%T has no metadata", obj)
}

// hasContent reports whether a YAML document has more than comments.
func hasContent(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return true
		}
	}
	return false
}

func findObject[T runtime.Object](objs []k8sObject, name string) (T, *k8sObject) {
	for i := range objs {
		if o, ok := objs[i].obj.(T); ok && objs[i].name == name {
			return o, &objs[i]
		}
	}
	var zero T
	return zero, nil
}

// checkKubernetes checks dir/kubernetes against the code and dir/Dockerfile.
func checkKubernetes(dir string) problems {
	var ps problems
	objs := loadKubernetes(&ps, dir)
	df := loadDockerfile(&ps, dir)
	checkKustomization(&ps, dir, objs)
	if df == nil {
		return ps
	}

	checkedConfigs := map[string]bool{} // "ConfigMap/key" loaded as a configuration
	deployments := 0
	for _, o := range objs {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		deployments++
		where := fmt.Sprintf("%s: Deployment %s", o.file, o.name)
		tmpl := d.Spec.Template
		if sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil || sel.Empty() || !sel.Matches(labels.Set(tmpl.Labels)) {
			ps.add("%s: spec.selector %v does not select spec.template's labels %v (%v)", where, d.Spec.Selector, tmpl.Labels, err)
		}
		pod := &tmpl.Spec
		var ours []string
		var adminPorts []string
		for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
			if !strings.Contains(c.Image, binaryName) {
				continue
			}
			ours = append(ours, c.Name)
			isInit := slices.ContainsFunc(pod.InitContainers, func(ic corev1.Container) bool { return ic.Name == c.Name })
			port := checkKubernetesContainer(&ps, fmt.Sprintf("%s: container %s", where, c.Name), objs, df, pod, c, isInit, checkedConfigs)
			adminPorts = append(adminPorts, port)
		}
		if len(ours) == 0 {
			ps.add("%s runs no %s image", where, binaryName)
			continue
		}
		checkSidecarOrder(&ps, where, pod, ours, adminPorts)
	}
	if deployments == 0 {
		ps.add("%s: no Deployment", filepath.Join(dir, kubernetesDir))
	}
	for _, o := range objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok {
			for _, key := range sortedKeys(cm.Data) {
				if !checkedConfigs[o.name+"/"+key] {
					ps.add("%s: ConfigMap %s: data.%s is the --config of no %s container, so nothing here checks it", o.file, o.name, key, binaryName)
				}
			}
		}
	}
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *corev1.Service:
			checkKubernetesService(&ps, objs, o, x)
		case *policyv1.PodDisruptionBudget:
			where := fmt.Sprintf("%s: PodDisruptionBudget %s", o.file, o.name)
			if len(podsSelectedBy(objs, x.Spec.Selector)) == 0 {
				ps.add("%s: spec.selector %v selects the pods of no Deployment", where, x.Spec.Selector)
			}
		}
	}
	return ps
}

func TestKubernetes(t *testing.T) { checkKubernetes(".").report(t) }

// checkKustomization decodes kubernetes/kustomization.yaml with kustomize's
// own type and loader (unknown fields are errors) and checks what it names.
func checkKustomization(ps *problems, dir string, objs []k8sObject) {
	file := filepath.Join(dir, kubernetesDir, kustomizationName)
	data, ok := readFile(ps, file)
	if !ok {
		return
	}
	var k kustomize.Kustomization
	if err := k.Unmarshal(data); err != nil {
		ps.add("%s: %v", file, err)
		return
	}
	for _, e := range k.EnforceFields() {
		ps.add("%s: %s", file, e)
	}
	inResources := map[string]bool{}
	for _, r := range k.Resources {
		if _, err := os.Stat(filepath.Join(dir, kubernetesDir, r)); err != nil {
			ps.add("%s: resources: %v", file, err)
		}
		inResources[filepath.Join(dir, kubernetesDir, r)] = true
	}
	images := map[string]bool{}
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.Deployment); ok && inResources[o.file] {
			for _, c := range append(slices.Clone(d.Spec.Template.Spec.InitContainers), d.Spec.Template.Spec.Containers...) {
				name, _, _ := strings.Cut(c.Image, "@")
				if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
					name = name[:i]
				}
				images[name] = true
			}
		}
	}
	for i, img := range k.Images {
		if !images[img.Name] {
			ps.add("%s: images[%d].name %q is the image of no container in its resources (%v): the tag would not be set", file, i, img.Name, sortedKeys(images))
		}
	}
}

// checkKubernetesContainer checks one delaybridge container and returns its
// admin port ("" if unknown).
func checkKubernetesContainer(ps *problems, where string, objs []k8sObject, df *dockerfile, pod *corev1.PodSpec, c corev1.Container, isInit bool, checked map[string]bool) string {
	if isInit && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
		ps.add("%s: an init container without restartPolicy: Always never finishes, so the pod never starts: make it a native sidecar (restartPolicy: Always) or a container", where)
	}
	inv := checkInvocation(ps, where+": command/args", df.command(c.Command, c.Args))
	if inv.sub != "run" {
		ps.add("%s runs %q, want run", where, inv.sub)
		return ""
	}
	cfgPath := inv.flags["config"]
	cmName, key := configMapMount(ps, where, pod, c, cfgPath)
	if cmName == "" {
		return ""
	}
	cm, cmObj := findObject[*corev1.ConfigMap](objs, cmName)
	if cmObj == nil {
		ps.add("%s: the volume of --config %s is ConfigMap %s, which is in no file of %s", where, cfgPath, cmName, kubernetesDir)
		return ""
	}
	text, ok := cm.Data[key]
	if !ok {
		ps.add("%s: ConfigMap %s has no data key %q, which %s mounts as %s", cmObj.file, cmName, key, where, cfgPath)
		return ""
	}
	checked[cmName+"/"+key] = true
	env := kubernetesEnv(ps, where, objs, c)
	cfgWhere := fmt.Sprintf("%s: ConfigMap %s: data.%s", cmObj.file, cmName, key)
	cfg, cfgProblems := loadConfig([]byte(text), env)
	ps.addAll(cfgWhere+": with the container's environment", cfgProblems)
	if cfg == nil {
		return ""
	}

	host, port := adminPort(ps, cfgWhere, cfg)
	if port == "" {
		ps.add("%s: admin.listen is empty: there is nothing to probe", cfgWhere)
		return ""
	}
	if !isLoopback(host) && !cfg.adminToken {
		ps.add("%s: admin.listen %s is reachable from the cluster but admin.token is empty: anyone could cancel or schedule messages", cfgWhere, cfg.adminListen)
	}
	if !isLoopback(host) && !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return strconv.Itoa(int(p.ContainerPort)) == port }) {
		ps.add("%s: ports: no containerPort %s (admin.listen %s of %s)", where, port, cfg.adminListen, cfgWhere)
	}
	if !slices.Contains(df.expose, port) {
		ps.add("%s: admin.listen port %s, but %s EXPOSEs %v", cfgWhere, port, dockerfileName, df.expose)
	}

	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
		required   bool
	}{
		{"startupProbe", "/healthz", c.StartupProbe, false},
		{"livenessProbe", "/healthz", c.LivenessProbe, true},
		{"readinessProbe", "/readyz", c.ReadinessProbe, true},
	} {
		pw := where + ": " + p.name
		switch {
		case p.probe == nil:
			if p.required {
				ps.add("%s: missing", pw)
			}
		case p.probe.HTTPGet != nil:
			g := p.probe.HTTPGet
			if g.Path != p.path {
				ps.add("%s.httpGet.path: %q, want %s (liveness must not fail when a broker is down; readiness must)", pw, g.Path, p.path)
			}
			checkRoute(ps, pw+".httpGet.path", g.Path)
			if got := resolvePort(c, g.Port); got != port {
				ps.add("%s.httpGet.port: %s is port %q, admin.listen of %s is port %s", pw, g.Port.String(), got, cfgWhere, port)
			}
			if isLoopback(host) {
				ps.add("%s: httpGet comes from the kubelet to the pod IP, but admin.listen is %s: listen on 0.0.0.0 (with a token), or use an exec probe", pw, cfg.adminListen)
			}
		case p.probe.Exec != nil:
			inv := checkInvocation(ps, pw+".exec.command", p.probe.Exec.Command)
			if inv.sub != "health" {
				ps.add("%s.exec.command runs %q, want health", pw, inv.sub)
				continue
			}
			if u := checkHealthURL(ps, pw+".exec.command", inv, p.path); u != nil && u.Port() != port {
				ps.add("%s.exec.command probes port %s, admin.listen of %s is port %s", pw, u.Port(), cfgWhere, port)
			}
		default:
			ps.add("%s: neither httpGet nor exec", pw)
		}
	}

	grace := time.Duration(corev1.DefaultTerminationGracePeriodSeconds) * time.Second
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	checkGrace(ps, where+": the pod's terminationGracePeriodSeconds", grace, cfgWhere, cfg.shutdownTimeout)

	// Security context: the container's settings, else the pod's.
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	psc := pod.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil {
		nonRoot = psc.RunAsNonRoot
	}
	uid := sc.RunAsUser
	if uid == nil {
		uid = psc.RunAsUser
	}
	switch {
	case uid != nil && *uid == 0:
		ps.add("%s: runAsUser 0 is root", where)
	case (nonRoot == nil || !*nonRoot) && uid == nil:
		ps.add("%s: securityContext: set runAsNonRoot: true (pod or container)", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		ps.add("%s: securityContext.readOnlyRootFilesystem: want true (delaybridge writes no files)", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		ps.add("%s: securityContext.allowPrivilegeEscalation: want false", where)
	}

	// Resources, and GOMEMLIMIT under the memory limit.
	for field, ok := range map[string]bool{
		"resources.requests.cpu":    !c.Resources.Requests.Cpu().IsZero(),
		"resources.requests.memory": !c.Resources.Requests.Memory().IsZero(),
		"resources.limits.memory":   !c.Resources.Limits.Memory().IsZero(),
	} {
		if !ok {
			ps.add("%s: %s is not set", where, field)
		}
	}
	if lim, gml := c.Resources.Limits.Memory(), env["GOMEMLIMIT"]; !lim.IsZero() && gml != "" {
		// GOMEMLIMIT's suffixes are KiB, MiB...; a Kubernetes quantity's Ki, Mi...
		g, err := resource.ParseQuantity(strings.TrimSuffix(gml, "B"))
		switch {
		case err != nil:
			ps.add("%s: env GOMEMLIMIT %q: %v", where, gml, err)
		case g.Cmp(*lim) >= 0:
			ps.add("%s: GOMEMLIMIT %s is not below resources.limits.memory %s: the container would be killed before the GC works harder", where, gml, lim)
		}
	}
	return port
}

// checkSidecarOrder checks a pod that runs delaybridge beside an application
// (kubernetes/sidecar-example.yaml). The app schedules messages at
// 127.0.0.1 from its first moment, so delaybridge must be ready before the
// app starts, and stop after it. Only a native sidecar gives that order (Kubernetes 1.29+): an init
// container with restartPolicy: Always, which the kubelet starts, and whose
// startupProbe it waits for, before the next containers, and which it stops
// after them. As a plain container there is no order at all.
func checkSidecarOrder(ps *problems, where string, pod *corev1.PodSpec, ours, adminPorts []string) {
	var apps []corev1.Container
	for _, c := range pod.Containers {
		if !slices.Contains(ours, c.Name) {
			apps = append(apps, c)
		}
	}
	if len(apps) == 0 {
		return // delaybridge on its own (kubernetes/deployment.yaml)
	}
	for _, name := range ours {
		i := slices.IndexFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == name })
		switch {
		case i < 0:
			ps.add("%s: container %s runs beside the app with no start order, so the app's first requests could find no server: make it a native sidecar (initContainers with restartPolicy: Always)", where, name)
		case pod.InitContainers[i].StartupProbe == nil:
			ps.add("%s: sidecar %s has no startupProbe: the app would start once the sidecar is started, not once it is ready", where, name)
		}
	}
	// Where the app is told to find the admin API.
	for _, app := range apps {
		for _, e := range app.Env {
			if !strings.HasPrefix(e.Name, "DELAYBRIDGE_") {
				continue
			}
			u, err := url.Parse(e.Value)
			if err != nil || u.Port() == "" {
				continue
			}
			if !isLoopback(u.Hostname()) || !slices.Contains(adminPorts, u.Port()) {
				ps.add("%s: container %s: env %s=%s is not the sidecar's admin server (127.0.0.1, port %v)", where, app.Name, e.Name, e.Value, adminPorts)
			}
		}
	}
}

func checkKubernetesService(ps *problems, objs []k8sObject, o k8sObject, svc *corev1.Service) {
	where := fmt.Sprintf("%s: Service %s", o.file, o.name)
	pods := podsSelectedBy(objs, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector})
	if len(svc.Spec.Selector) == 0 || len(pods) == 0 {
		ps.add("%s: spec.selector %v selects the pods of no Deployment", where, svc.Spec.Selector)
		return
	}
	for _, d := range pods {
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort
			if target.IntVal == 0 && target.StrVal == "" {
				target = intstr.FromInt32(p.Port)
			}
			if !slices.ContainsFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool {
				n := resolvePort(c, target)
				return slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return strconv.Itoa(int(cp.ContainerPort)) == n })
			}) {
				ps.add("%s: ports[%s].targetPort %s is no containerPort of Deployment %s", where, p.Name, target.String(), d.Name)
			}
		}
	}
}

// podsSelectedBy is every Deployment whose pods sel selects.
func podsSelectedBy(objs []k8sObject, sel *metav1.LabelSelector) []*appsv1.Deployment {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return nil
	}
	var out []*appsv1.Deployment
	for _, o := range objs {
		if d, ok := o.obj.(*appsv1.Deployment); ok && s.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

// resolvePort turns a port (number or name of one of c's ports) into its number.
func resolvePort(c corev1.Container, port intstr.IntOrString) string {
	if port.Type == intstr.Int {
		return strconv.Itoa(int(port.IntVal))
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return port.StrVal
}

// configMapMount finds the ConfigMap and key that a container sees at file.
func configMapMount(ps *problems, where string, pod *corev1.PodSpec, c corev1.Container, file string) (name, key string) {
	for _, m := range c.VolumeMounts {
		dir := strings.TrimSuffix(m.MountPath, "/") + "/"
		var rel string
		switch {
		case m.SubPath != "" && m.MountPath == file:
			rel = m.SubPath
		case m.SubPath == "" && strings.HasPrefix(file, dir):
			rel = strings.TrimPrefix(file, dir)
		default:
			continue
		}
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			ps.add("%s: volumeMounts: %s names no volume of the pod", where, m.Name)
			return "", ""
		}
		v := pod.Volumes[i]
		if v.ConfigMap == nil {
			ps.add("%s: volume %s (mounted at %s, holding --config %s) is not a ConfigMap", where, v.Name, m.MountPath, file)
			return "", ""
		}
		if len(v.ConfigMap.Items) == 0 {
			return v.ConfigMap.Name, rel
		}
		for _, it := range v.ConfigMap.Items {
			if it.Path == rel {
				return v.ConfigMap.Name, it.Key
			}
		}
		ps.add("%s: volume %s projects no item to %s (--config %s)", where, v.Name, rel, file)
		return "", ""
	}
	ps.add("%s: no volumeMount holds --config %q", where, file)
	return "", ""
}

// kubernetesEnv is the environment a container gets from env and envFrom,
// with Secrets and ConfigMaps resolved from the files of deploy/kubernetes.
func kubernetesEnv(ps *problems, where string, objs []k8sObject, c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		var data map[string]string
		switch {
		case ef.SecretRef != nil:
			data = kubernetesData(ps, where+": envFrom", objs, "Secret", ef.SecretRef.Name, ef.SecretRef.Optional)
		case ef.ConfigMapRef != nil:
			data = kubernetesData(ps, where+": envFrom", objs, "ConfigMap", ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional)
		}
		for k, v := range data {
			env[ef.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		var kind, name, key string
		var optional *bool
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
			continue
		case e.ValueFrom.SecretKeyRef != nil:
			r := e.ValueFrom.SecretKeyRef
			kind, name, key, optional = "Secret", r.Name, r.Key, r.Optional
		case e.ValueFrom.ConfigMapKeyRef != nil:
			r := e.ValueFrom.ConfigMapKeyRef
			kind, name, key, optional = "ConfigMap", r.Name, r.Key, r.Optional
		default:
			continue // fieldRef, resourceFieldRef: not known here
		}
		data := kubernetesData(ps, where+": env "+e.Name, objs, kind, name, optional)
		if v, ok := data[key]; ok {
			env[e.Name] = v
		} else if data != nil && (optional == nil || !*optional) {
			ps.add("%s: env %s: %s %s has no key %s", where, e.Name, kind, name, key)
		}
	}
	return env
}

func kubernetesData(ps *problems, where string, objs []k8sObject, kind, name string, optional *bool) map[string]string {
	out := map[string]string{}
	switch kind {
	case "Secret":
		if s, o := findObject[*corev1.Secret](objs, name); o != nil {
			for k, v := range s.Data {
				out[k] = string(v)
			}
			for k, v := range s.StringData {
				out[k] = v
			}
			return out
		}
	case "ConfigMap":
		if cm, o := findObject[*corev1.ConfigMap](objs, name); o != nil {
			for k, v := range cm.Data {
				out[k] = v
			}
			return out
		}
	}
	if optional == nil || !*optional {
		ps.add("%s: %s %s is in no file of %s", where, kind, name, kubernetesDir)
	}
	return nil
}
