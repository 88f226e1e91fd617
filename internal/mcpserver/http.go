package mcpserver

import (
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cella-sandbox/cella/internal/client"
)

// HTTPHandler serves MCP over streamable HTTP on the daemon. Each session's
// tools act with the API key of the request that opened it, against the
// daemon that received it; the caller authenticates every request.
// budget gives the tool-call budget of the session a request opens.
func HTTPHandler(budget func(*http.Request) int64, network func(*http.Request) string, version string) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		self := scheme + "://" + r.Host
		c, err := client.New(client.Config{URL: self, APIKey: key})
		if err != nil {
			return nil
		}
		return New(Config{Client: c, DaemonURL: self, MaxCalls: budget(r), Network: network(r), Version: version})
	}, nil)
}
