package upgrade

import (
	"errors"
	"net/http"
	"testing"
)

func TestCheck(t *testing.T) {
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Add(kv[i], kv[i+1])
		}
		return out
	}
	websocket := h("Connection", "keep-alive, Upgrade", "Upgrade", "websocket")
	for _, c := range []struct {
		name    string
		status  int
		asked   http.Header
		answer  http.Header
		refused bool
	}{
		{"not a 101", http.StatusOK, http.Header{}, h("Upgrade", "other"), false},
		{"the upgrade asked for", http.StatusSwitchingProtocols, websocket, h("Connection", "Upgrade", "Upgrade", "WebSocket"), false},
		{"a bare 101", http.StatusSwitchingProtocols, websocket, http.Header{}, true},
		{"a 101 to a request that asked for none", http.StatusSwitchingProtocols, http.Header{}, h("Connection", "Upgrade", "Upgrade", "websocket"), true},
		{"Upgrade without Connection: Upgrade asks for nothing", http.StatusSwitchingProtocols, h("Upgrade", "websocket"), h("Connection", "Upgrade", "Upgrade", "websocket"), true},
		{"another protocol", http.StatusSwitchingProtocols, websocket, h("Connection", "Upgrade", "Upgrade", "h2c"), true},
		// Equal only under a Unicode case fold, which httputil does not
		// apply (it refuses these itself, leaving the connection open).
		{"Kelvin's K for k", http.StatusSwitchingProtocols, websocket, h("Connection", "Upgrade", "Upgrade", "websoc\u212aet"), true},
		{"a long s for s", http.StatusSwitchingProtocols, websocket, h("Connection", "Upgrade", "Upgrade", "web\u017focket"), true},
		{"not printable", http.StatusSwitchingProtocols, h("Connection", "Upgrade", "Upgrade", "web\x01socket"), h("Connection", "Upgrade", "Upgrade", "web\x01socket"), true},
	} {
		res := &http.Response{StatusCode: c.status, Header: c.answer, Request: &http.Request{Header: c.asked}}
		err := Check(res)
		var unasked *UnaskedError
		if got := errors.As(err, &unasked); got != c.refused {
			t.Errorf("%s: Check = %v, want refused %v", c.name, err, c.refused)
		}
	}
}
