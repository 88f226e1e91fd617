package api

import "net/http"

// routeMux is the API's ServeMux, remembering every pattern registered on
// it, so that TestOpenAPIRoutes can hold the routes the server serves
// against the OpenAPI document (internal/apiwire/openapi.yaml) both ways.
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func newRouteMux() *routeMux { return &routeMux{ServeMux: http.NewServeMux()} }

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, h)
}

// handleAs registers one pattern that serves several documented routes
// (ServeMux refuses overlapping patterns neither of which is more
// specific); the documented ones are what TestOpenAPIRoutes sees.
func (m *routeMux) handleAs(documented []string, pattern string, h http.Handler) {
	m.patterns = append(m.patterns, documented...)
	m.ServeMux.Handle(pattern, h)
}
