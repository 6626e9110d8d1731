// Renders deploy/helm/spoold the way `helm template` does, for the
// chart's tests where Helm cannot be installed (tests/process/helm.rs): Go's
// text/template (Helm's engine) with the Sprig and Helm functions the
// chart uses. It reads one JSON object on stdin,
// {"Values": …, "Chart": …, "Release": …}, and writes the manifests.
// deploy/helm/render.py merges the values files and calls it.
//
//	go run ./deploy/helm/render deploy/helm/spoold < context.json
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/template"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: render CHART_DIR < context.json")
		os.Exit(2)
	}
	var context map[string]interface{}
	if err := json.NewDecoder(os.Stdin).Decode(&context); err != nil {
		fail(err)
	}
	out, err := render(os.Args[1], context)
	if err != nil {
		fail(err)
	}
	os.Stdout.WriteString(out)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "render:", err)
	os.Exit(1)
}

func render(chart string, context map[string]interface{}) (string, error) {
	files, err := filepath.Glob(filepath.Join(chart, "templates", "*"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	root := template.New("chart").Option("missingkey=default")
	root.Funcs(functions(root))
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		if _, err := root.New(filepath.Base(f)).Parse(string(text)); err != nil {
			return "", err
		}
	}
	var out strings.Builder
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasPrefix(name, "_") || !strings.HasSuffix(name, ".yaml") {
			continue
		}
		var buf bytes.Buffer
		if err := root.ExecuteTemplate(&buf, name, context); err != nil {
			return "", err
		}
		text := strings.ReplaceAll(buf.String(), "<no value>", "")
		if strings.TrimSpace(text) == "" {
			continue
		}
		fmt.Fprintf(&out, "---\n# Source: spoold/templates/%s\n%s\n", name, strings.TrimLeft(text, "\n"))
	}
	return out.String(), nil
}

func functions(root *template.Template) template.FuncMap {
	return template.FuncMap{
		"include": func(name string, data interface{}) (string, error) {
			var buf bytes.Buffer
			err := root.ExecuteTemplate(&buf, name, data)
			return strings.ReplaceAll(buf.String(), "<no value>", ""), err
		},
		"required": func(message string, v interface{}) (interface{}, error) {
			if empty(v) {
				return nil, errors.New(message)
			}
			return v, nil
		},
		"fail":    func(message string) (string, error) { return "", errors.New(message) },
		"default": func(fallback, v interface{}) interface{} {
			if empty(v) {
				return fallback
			}
			return v
		},
		"quote": func(v interface{}) string {
			if v == nil {
				return `""`
			}
			return fmt.Sprintf("%q", fmt.Sprint(v))
		},
		"contains":   func(sub, s string) bool { return strings.Contains(s, sub) },
		"trimSuffix": func(suffix, s string) string { return strings.TrimSuffix(s, suffix) },
		"trunc": func(n int, s string) string {
			if len(s) > n {
				return s[:n]
			}
			return s
		},
		"indent":  func(n int, s string) string { return indent(n, s) },
		"nindent": func(n int, s string) string { return "\n" + indent(n, s) },
		"toYaml":  func(v interface{}) string { return strings.TrimSuffix(toYaml(v, 0), "\n") },
		"dict": func(pairs ...interface{}) map[string]interface{} {
			d := map[string]interface{}{}
			for i := 0; i+1 < len(pairs); i += 2 {
				d[fmt.Sprint(pairs[i])] = pairs[i+1]
			}
			return d
		},
		"list": func(items ...interface{}) []interface{} { return items },
		"has": func(needle interface{}, haystack []interface{}) bool {
			for _, h := range haystack {
				if fmt.Sprint(h) == fmt.Sprint(needle) {
					return true
				}
			}
			return false
		},
		"int": toInt,
		"until": func(n int) []int {
			r := make([]int, n)
			for i := range r {
				r[i] = i
			}
			return r
		},
		"add1": func(v interface{}) int { return toInt(v) + 1 },
	}
}

func toInt(v interface{}) int {
	switch n := v.(type) {
	case int:
		return n
	case float64:
		return int(n)
	case string:
		var i int
		fmt.Sscan(n, &i)
		return i
	}
	return 0
}

// Sprig's notion of empty: nil, false, 0, "" and empty collections.
func empty(v interface{}) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case float64:
		return x == 0
	case int:
		return x == 0
	case []interface{}:
		return len(x) == 0
	case map[string]interface{}:
		return len(x) == 0
	}
	return false
}

func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
}

// toYaml writes JSON-decoded values as block YAML (keys sorted, as Helm's
// toYaml does); strings are double-quoted, which YAML reads as written.
func toYaml(v interface{}, depth int) string {
	pad := strings.Repeat("  ", depth)
	switch x := v.(type) {
	case map[string]interface{}:
		if len(x) == 0 {
			return pad + "{}\n"
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			if scalar(x[k]) {
				fmt.Fprintf(&b, "%s%s: %s\n", pad, k, inline(x[k]))
			} else {
				fmt.Fprintf(&b, "%s%s:\n%s", pad, k, toYaml(x[k], depth+1))
			}
		}
		return b.String()
	case []interface{}:
		if len(x) == 0 {
			return pad + "[]\n"
		}
		var b strings.Builder
		for _, item := range x {
			if scalar(item) {
				fmt.Fprintf(&b, "%s- %s\n", pad, inline(item))
			} else {
				inner := toYaml(item, depth+1)
				fmt.Fprintf(&b, "%s- %s", pad, strings.TrimPrefix(inner, pad+"  "))
			}
		}
		return b.String()
	default:
		text, _ := json.Marshal(x)
		return string(text)
	}
}

// A scalar or an empty collection, on one line.
func inline(v interface{}) string {
	switch x := v.(type) {
	case map[string]interface{}:
		return "{}"
	case []interface{}:
		return "[]"
	default:
		text, _ := json.Marshal(x)
		return string(text)
	}
}

func scalar(v interface{}) bool {
	switch x := v.(type) {
	case map[string]interface{}:
		return len(x) == 0
	case []interface{}:
		return len(x) == 0
	}
	return true
}
