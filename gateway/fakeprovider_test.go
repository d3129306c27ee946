package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fakeProvider is a test double of the upstream model provider and its OAuth endpoints.
// Like real providers it accepts only the newest access token and rotates the refresh
// token on every refresh, invalidating the old one. It records every request it gets.
type fakeProvider struct {
	srv *httptest.Server

	// onRefresh, when set, runs before a refresh is answered (the test holds it there).
	onRefresh func()
	// onStream, when set, serves streamed chat completions instead of the default.
	onStream func(w http.ResponseWriter, r *http.Request)
	// onModel, when set, sees each model request that passed the token check.
	onModel func(r *http.Request)
	// answerAs, when set, is the identity refreshes are answered for.
	answerAs string

	mu        sync.Mutex
	identity  string
	access    string
	refresh   string
	seq       int
	refreshes int
	requests  []recordedRequest
	// reject401, while positive, makes that many model requests fail with 401 even with
	// the newest token (the provider revoked it early).
	reject401 int
}

type recordedRequest struct {
	Method, Path, RawPath, Host string
	Header                      http.Header
}

func newFakeProvider(t *testing.T, identity string) *fakeProvider {
	p := &fakeProvider{identity: identity, access: "secret-access-0", refresh: "secret-refresh-0"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /oauth/token", p.token)
	mux.HandleFunc("POST /oauth/device", p.device)
	mux.HandleFunc("GET /v1/models", p.model(demoModels))
	mux.HandleFunc("POST /v1/chat/completions", p.model(p.chat))
	mux.HandleFunc("POST /v1/embeddings", p.model(demoEmbeddings))
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests = append(p.requests, recordedRequest{r.Method, r.URL.Path, r.URL.RawPath, r.Host, r.Header.Clone()})
		p.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakeProvider) baseURL() string  { return p.srv.URL + "/v1" }
func (p *fakeProvider) tokenURL() string { return p.srv.URL + "/oauth/token" }

func (p *fakeProvider) state() (access, refresh string, refreshes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.access, p.refresh, p.refreshes
}

func (p *fakeProvider) recorded() []recordedRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]recordedRequest(nil), p.requests...)
}

func idToken(sub string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":%q}`, sub))) + ".sig"
}

func (p *fakeProvider) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "error_description": "not form-encoded: " + ct})
		return
	}
	switch r.PostForm.Get("grant_type") {
	case "refresh_token":
		if p.onRefresh != nil {
			p.onRefresh()
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if r.PostForm.Get("refresh_token") != p.refresh {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant", "error_description": "refresh token is not current"})
			return
		}
		p.issueLocked(w)
	case "urn:ietf:params:oauth:grant-type:device_code":
		p.mu.Lock()
		defer p.mu.Unlock()
		if r.PostForm.Get("device_code") != "dev-code" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant"})
			return
		}
		p.seq++
		if p.seq == 1 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "authorization_pending"})
			return
		}
		p.issueLocked(w)
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unsupported_grant_type"})
	}
}

// issueLocked rotates both tokens and answers them.
func (p *fakeProvider) issueLocked(w http.ResponseWriter) {
	p.refreshes++
	p.access = fmt.Sprintf("secret-access-%d", p.refreshes)
	p.refresh = fmt.Sprintf("secret-refresh-%d", p.refreshes)
	who := p.identity
	if p.answerAs != "" {
		who = p.answerAs
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"access_token": p.access, "refresh_token": p.refresh, "token_type": "Bearer",
		"expires_in": 3600, "id_token": idToken(who),
	})
}

func (p *fakeProvider) device(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"device_code": "dev-code", "user_code": "ABCD-EFGH", "verification_uri": p.srv.URL + "/activate",
		"expires_in": 600, "interval": 0,
	})
}

// model guards a model endpoint with the newest access token.
func (p *fakeProvider) model(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		ok := r.Header.Get("Authorization") == "Bearer "+p.access
		if ok && p.reject401 > 0 {
			p.reject401--
			ok = false
		}
		p.mu.Unlock()
		if !ok {
			writeOpenAIError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "bad token")
			return
		}
		if p.onModel != nil {
			p.onModel(r)
		}
		h(w, r)
	}
}

func (p *fakeProvider) chat(w http.ResponseWriter, r *http.Request) {
	if p.onStream != nil && strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		p.onStream(w, r)
		return
	}
	var req map[string]any
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "chat.completion", "model": req["model"],
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop", "message": map[string]string{"role": "assistant", "content": "fake"}}},
	})
}
