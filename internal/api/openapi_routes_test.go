package api

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/cella-sandbox/cella/internal/apiwire/spec"
)

// paramRe matches a path parameter of either syntax: ServeMux's {id} and
// {rest...}, OpenAPI's {sandboxID}. Names differ (the document keeps E2B's);
// routing does not depend on them.
var paramRe = regexp.MustCompile(`\{[^}]*\}`)

// route is "METHOD /path/{}" with parameter names dropped; a ServeMux
// pattern without a method has method "*" (it serves every method).
func route(method, path string) string {
	return method + " " + paramRe.ReplaceAllString(path, "{}")
}

// TestOpenAPIRoutes: every pattern the server registers is in the OpenAPI
// document (apiwire/openapi.yaml) with its method, and every operation of
// the document is served. A route added without documenting it, or a
// documented route removed, fails here with the list of both.
func TestOpenAPIRoutes(t *testing.T) {
	s := New(Config{})
	defer s.Close()
	doc, err := spec.Load()
	if err != nil {
		t.Fatal(err)
	}

	served := map[string]bool{}    // route(method, path)
	anyMethod := map[string]bool{} // route("*", path) of method-less patterns
	for _, p := range s.mux.patterns {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			method, path = "*", p
		}
		if strings.Contains(path, "{$}") || !strings.HasPrefix(path, "/") {
			t.Fatalf("pattern %q: host patterns and {$} are not mapped to the document yet", p)
		}
		served[route(method, path)] = true
		if method == "*" {
			anyMethod[route("*", path)] = true
		}
	}

	documented := map[string]bool{}
	documentedPath := map[string]bool{} // route("*", path) of every documented path
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[route(method, path)] = true
			documentedPath[route("*", path)] = true
		}
	}

	var undocumented, unserved []string
	for r := range served {
		if strings.HasPrefix(r, "* ") {
			if !documentedPath[r] {
				undocumented = append(undocumented, r)
			}
			continue
		}
		if !documented[r] {
			undocumented = append(undocumented, r)
		}
	}
	for r := range documented {
		_, path, _ := strings.Cut(r, " ")
		if !served[r] && !anyMethod[route("*", path)] {
			unserved = append(unserved, r)
		}
	}
	slices.Sort(undocumented)
	slices.Sort(unserved)
	if len(undocumented) > 0 {
		t.Errorf("routes the server registers that internal/apiwire/openapi.yaml does not describe (document them, then make api):\n\t%s",
			strings.Join(undocumented, "\n\t"))
	}
	if len(unserved) > 0 {
		t.Errorf("operations of internal/apiwire/openapi.yaml the server does not serve:\n\t%s", strings.Join(unserved, "\n\t"))
	}
	if len(served) < 40 {
		t.Errorf("only %d routes recorded: is every registration going through routeMux?", len(served))
	}
}
