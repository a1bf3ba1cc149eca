// ringlane-helm-render renders a Helm chart the way `helm template` does, for
// the subset of Helm that deploy/helm/ringlane uses (no helm binary exists on
// the build machines): Go's text/template with the sprig functions, plus
// Helm's include, tpl, required, toYaml, fromYaml, toJson and .Files.Get;
// .Values (values.yaml deep-merged with each -f file in order, maps merged,
// everything else replaced), .Chart (Chart.yaml), .Release (Name, Namespace,
// Service, IsInstall, Revision) and .Template (Name, BasePath). Files under
// templates/ whose names start with "_" only define templates; NOTES.txt is
// skipped; a document that renders to whitespace is dropped, as Helm does.
// Not supported: subcharts, hooks, lookup, .Capabilities beyond
// KubeVersion, --set.
//
//	ringlane-helm-render -chart DIR [-f values.yaml ...] [-name RELEASE] [-namespace NS]
//
// Builds offline from Debian's Go packages (GO111MODULE=off,
// GOPATH=/usr/share/gocode; golang-github-masterminds-sprig-dev,
// golang-gopkg-yaml.v3-dev).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig"
	"gopkg.in/yaml.v3"
)

type valueFiles []string

func (v *valueFiles) String() string     { return strings.Join(*v, ",") }
func (v *valueFiles) Set(s string) error { *v = append(*v, s); return nil }

// Files is .Files: the chart's files, read relative to the chart directory.
type Files struct{ dir string }

// Get returns the file's contents, or "" when it cannot be read (as Helm).
func (f Files) Get(name string) string {
	b, err := os.ReadFile(filepath.Join(f.dir, filepath.FromSlash(name)))
	if err != nil {
		return ""
	}
	return string(b)
}

func readYAML(file string) (map[string]interface{}, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]interface{}{}
	if err := yaml.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	if out == nil {
		out = map[string]interface{}{}
	}
	return out, nil
}

// merge copies src into dst: maps merge key by key, anything else replaces.
func merge(dst, src map[string]interface{}) map[string]interface{} {
	for k, v := range src {
		if sm, ok := v.(map[string]interface{}); ok {
			if dm, ok := dst[k].(map[string]interface{}); ok {
				dst[k] = merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

func toYAML(v interface{}) string {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return ""
	}
	enc.Close()
	return strings.TrimSuffix(buf.String(), "\n")
}

func fromYAML(s string) map[string]interface{} {
	out := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(s), &out); err != nil {
		out["Error"] = err.Error()
	}
	return out
}

func main() {
	chart := flag.String("chart", "", "chart directory")
	name := flag.String("name", "ringlane", "release name")
	namespace := flag.String("namespace", "default", "release namespace")
	var files valueFiles
	flag.Var(&files, "f", "values file merged over values.yaml (repeatable)")
	flag.Parse()
	if *chart == "" {
		fmt.Fprintln(os.Stderr, "ringlane-helm-render: -chart is required")
		os.Exit(2)
	}
	if err := render(*chart, *name, *namespace, files); err != nil {
		fmt.Fprintln(os.Stderr, "ringlane-helm-render:", err)
		os.Exit(1)
	}
}

func render(dir, name, namespace string, files []string) error {
	meta, err := readYAML(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return err
	}
	chartObj := map[string]interface{}{}
	for k, v := range meta {
		chartObj[strings.ToUpper(k[:1])+k[1:]] = v
	}
	values, err := readYAML(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		extra, err := readYAML(f)
		if err != nil {
			return err
		}
		values = merge(values, extra)
	}
	chartName, _ := chartObj["Name"].(string)

	tpl := template.New("gotpl")
	funcs := sprig.TxtFuncMap()
	delete(funcs, "env")
	delete(funcs, "expandenv")
	funcs["toYaml"] = toYAML
	funcs["fromYaml"] = fromYAML
	funcs["required"] = func(msg string, v interface{}) (interface{}, error) {
		if v == nil {
			return nil, fmt.Errorf("%s", msg)
		}
		if s, ok := v.(string); ok && s == "" {
			return nil, fmt.Errorf("%s", msg)
		}
		return v, nil
	}
	funcs["include"] = func(name string, data interface{}) (string, error) {
		var buf bytes.Buffer
		err := tpl.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
	funcs["tpl"] = func(text string, data interface{}) (string, error) {
		t, err := tpl.Clone()
		if err != nil {
			return "", err
		}
		t, err = t.New("tpl").Parse(text)
		if err != nil {
			return "", err
		}
		var buf bytes.Buffer
		err = t.Execute(&buf, data)
		return strings.ReplaceAll(buf.String(), "<no value>", ""), err
	}
	tpl.Funcs(funcs).Option("missingkey=zero")

	tdir := filepath.Join(dir, "templates")
	entries, err := os.ReadDir(tdir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(tdir, e.Name()))
		if err != nil {
			return err
		}
		full := path.Join(chartName, "templates", e.Name())
		if _, err := tpl.New(full).Parse(string(b)); err != nil {
			return err
		}
		if !strings.HasPrefix(e.Name(), "_") && e.Name() != "NOTES.txt" {
			names = append(names, full)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		data := map[string]interface{}{
			"Values": values,
			"Chart":  chartObj,
			"Release": map[string]interface{}{
				"Name": name, "Namespace": namespace, "Service": "Helm",
				"IsInstall": true, "IsUpgrade": false, "Revision": 1,
			},
			"Template":     map[string]interface{}{"Name": n, "BasePath": path.Join(chartName, "templates")},
			"Files":        Files{dir: dir},
			"Capabilities": map[string]interface{}{"KubeVersion": map[string]interface{}{"Version": "v1.30.0", "Major": "1", "Minor": "30"}},
		}
		var buf bytes.Buffer
		if err := tpl.ExecuteTemplate(&buf, n, data); err != nil {
			return err
		}
		out := strings.ReplaceAll(buf.String(), "<no value>", "")
		for _, doc := range strings.Split(out, "\n---") {
			doc = strings.TrimPrefix(doc, "---")
			if strings.TrimSpace(doc) == "" {
				continue
			}
			fmt.Printf("---\n# Source: %s\n%s\n", n, strings.Trim(doc, "\n"))
		}
	}
	return nil
}
