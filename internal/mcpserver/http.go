package mcpserver

import (
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cella-sandbox/cella/internal/client"
)

// HTTPConfig configures MCP over streamable HTTP on the daemon.
type HTTPConfig struct {
	// API reaches the daemon's own API at APIURL: the daemon serves it in
	// process. Never a host the request names: a tool call would take the
	// caller's key wherever its Host header pointed.
	API    *http.Client
	APIURL string
	// Budget gives the tool-call budget of the session a request opens;
	// Network what its key's sandboxes may reach.
	Budget  func(*http.Request) int64
	Network func(*http.Request) string
	Version string
}

// HTTPHandler serves MCP over streamable HTTP on the daemon. Each session's
// tools act with the API key of the request that opened it, through
// cfg.API; the caller authenticates every request.
func HTTPHandler(cfg HTTPConfig) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		c, err := client.New(client.Config{URL: cfg.APIURL, APIKey: key, HTTP: cfg.API})
		if err != nil {
			return nil
		}
		// Preview URLs name the daemon as the caller reached it; they are
		// only text handed back to the caller, never dialed.
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		return New(Config{Client: c, DaemonURL: scheme + "://" + r.Host, MaxCalls: cfg.Budget(r), Network: cfg.Network(r), Version: cfg.Version})
	}, nil)
}
