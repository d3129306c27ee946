package backend

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"unicode/utf8"

	"hermeshost/sartiq"
)

// decoders are every request body the API reads, decoded and validated as the handlers do.
var decoders = []func(r *http.Request) (any, error){
	decodeValidated(true, validateHeartbeat),
	decodeValidated(false, validateEvent),
	decodeValidated(false, validateComplete),
	decodeValidated(false, validateFail),
	decodeValidated(true, validateRelease),
	decodeValidated(false, validateProductProposals),
	decodeValidated(false, validateGuidelines),
	decodeValidated(false, validatePresign),
}

func decodeValidated[T any](optional bool, validate func(*T) error) func(r *http.Request) (any, error) {
	return func(r *http.Request) (any, error) {
		var req T
		if err := decodeBody(r, &req, optional); err != nil {
			return nil, err
		}
		return &req, validate(&req)
	}
}

// FuzzDecodeRequest: whatever arrives, decoding answers either a valid request or an
// apiError with a client status and a short message; never a panic, never a 500. A
// request that passes survives a round trip through JSON.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(uint8(0), "application/json", []byte(`{"progress": {"step": 1}}`))
	f.Add(uint8(1), "application/json", []byte(`{"kind": "note", "message": "hi", "data": {}}`))
	f.Add(uint8(2), "", []byte(`{"result": {}}`))
	f.Add(uint8(3), "application/json; charset=utf-8", []byte(`{"reason": "x"}`))
	f.Add(uint8(5), "application/json", []byte(`{"products": [{"sku": "a", "name": "b", "attributes": {"k": 1}}]}`))
	f.Add(uint8(6), "application/merge-patch+json", []byte(`{"content": "c", "sources": ["s"]}`))
	f.Add(uint8(7), "application/json", []byte(`{"filename": "a.png", "content_type": "image/png", "size": 3}`))
	f.Add(uint8(1), "text/plain", []byte(`{"kind": "x"}`))
	f.Add(uint8(5), "application/json", []byte(`{"products": [{"sku": "a'--", "name": 1}]} trailing`))
	f.Fuzz(func(t *testing.T, which uint8, contentType string, body []byte) {
		decode := decoders[int(which)%len(decoders)]
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		req, err := decode(r)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) {
				t.Fatalf("not an apiError: %v", err)
			}
			switch ae.status {
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			default:
				t.Fatalf("status %d for bad input", ae.status)
			}
			if len(ae.message) > 400 || !utf8.ValidString(ae.message) {
				t.Fatalf("message too long or not UTF-8: %q", ae.message)
			}
			return
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		r2 := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(again))
		if _, err := decode(r2); err != nil {
			t.Fatalf("accepted %q but not its re-encoding %q: %v", body, again, err)
		}
	})
}

func TestHeartbeatBodyIsOptional(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	var req sartiq.HeartbeatRequest
	if err := decodeBody(r, &req, true); err != nil {
		t.Fatal(err)
	}
}
