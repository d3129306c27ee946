package backend

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"hermeshost/sartiq"
)

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeProductIngest)
	token := b.claim(id)
	job := b.expect(token)
	job.POST("/agent-jobs/{id}/start", id).Expect().Status(http.StatusOK)
	before := b.snapshot()

	bodies := []struct {
		name, path, contentType string
		body                    []byte
		status                  int
	}{
		{"malformed JSON", "/agent-jobs/" + id + "/heartbeat", "application/json", []byte(`{"progress": {`), 400},
		{"wrong type", "/agent-jobs/" + id + "/heartbeat", "application/json", []byte(`{"progress": "half"}`), 400},
		{"unknown field", "/agent-jobs/" + id + "/heartbeat", "application/json", []byte(`{"progres": {}}`), 400},
		{"trailing data", "/agent-jobs/" + id + "/heartbeat", "application/json", []byte(`{} {}`), 400},
		{"not JSON", "/agent-jobs/" + id + "/heartbeat", "text/plain", []byte(`progress`), 415},
		{"huge body", "/agent-jobs/" + id + "/events", "application/json",
			append(append([]byte(`{"kind":"note","message":"`), bytes.Repeat([]byte("a"), 2<<20)...), `"}`...), 413},
		{"kind of the wrong type", "/agent-jobs/" + id + "/events", "application/json", []byte(`{"kind": 5}`), 400},
		{"forged lifecycle event", "/agent-jobs/" + id + "/events", "application/json", []byte(`{"kind": "reclaim"}`), 400},
		{"missing body", "/agent-jobs/" + id + "/complete", "application/json", nil, 400},
		{"result not an object", "/agent-jobs/" + id + "/complete", "application/json", []byte(`{"result": [1]}`), 400},
		{"empty reason", "/agent-jobs/" + id + "/fail", "application/json", []byte(`{"reason": ""}`), 400},
		{"SKU with SQL", "/organizations/acme/product-proposals", "application/json",
			[]byte(`{"products": [{"sku": "x'); DROP TABLE products; --", "name": "x"}]}`), 400},
		{"duplicate SKU", "/organizations/acme/product-proposals", "application/json",
			[]byte(`{"products": [{"sku": "a1", "name": "x"}, {"sku": "a1", "name": "y"}]}`), 400},
		{"no products", "/organizations/acme/product-proposals", "application/json", []byte(`{"products": []}`), 400},
		{"traversal filename", "/uploads/presign", "application/json", []byte(`{"filename": "../../etc/passwd", "content_type": "text/plain", "size": 1}`), 400},
		{"oversized upload", "/uploads/presign", "application/json", []byte(`{"filename": "a.bin", "content_type": "application/octet-stream", "size": 999999999}`), 400},
	}
	for _, c := range bodies {
		req := job.POST(c.path).WithBytes(c.body)
		if c.contentType != "" {
			req = req.WithHeader("Content-Type", c.contentType)
		}
		obj := req.Expect().Status(c.status).JSON().Object()
		obj.ContainsKey("error").ContainsKey("message")
		if msg := obj.Value("message").String().Raw(); strings.Contains(msg, "goroutine") || strings.Contains(msg, token) {
			t.Errorf("%s: message %q", c.name, msg)
		}
	}

	for _, path := range []string{
		"/agent-jobs/not-a-uuid/claim",
		"/agent-jobs/..%2F..%2Fetc%2Fpasswd/claim",
		"/agent-jobs/1'%20OR%20'1'='1/claim",
		"/agent-jobs/" + strings.ToUpper(id) + "x/claim",
	} {
		b.bot().POST(path).Expect().Status(http.StatusBadRequest).JSON().Object().Value("error").IsEqual("bad_request")
	}
	for _, path := range []string{
		"/organizations/ACME/products",
		"/organizations/acme;DELETE/products",
		"/organizations/%2E%2E/products",
		"/organizations/-acme/products",
	} {
		job.GET(path).Expect().Status(http.StatusBadRequest)
	}
	job.PUT("/organizations/acme/guidelines/..%2Fproducts/proposal").WithJSON(map[string]any{"content": "x"}).
		Expect().Status(http.StatusBadRequest)
	for _, q := range []map[string]string{
		{"limit": "0"}, {"limit": "abc"}, {"limit": "100000"}, {"type": "robots"}, {"status": "DONE"},
		{"status": "QUEUED,"}, {"cursor": "!!"}, {"cursor": "MjAyNnxub3QtYS11dWlk"}, {"organization_id": "a b"},
	} {
		req := b.bot().GET("/agent-jobs")
		for k, v := range q {
			req = req.WithQuery(k, v)
		}
		req.Expect().Status(http.StatusBadRequest)
	}
	b.bot().GET("/agent-jobs/{id}/events", id).WithQuery("cursor", "-1").Expect().Status(http.StatusBadRequest)
	b.unchanged(before)

	if strings.Contains(b.logs.String(), token) || strings.Contains(b.logs.String(), testBotToken) {
		t.Fatal("a token reached the logs")
	}
}

func TestPresignedUploads(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("globex", sartiq.TypeGuidelinesExtraction)
	job := b.expect(b.claim(id))
	presign := func(size int) string {
		url := job.POST("/uploads/presign").WithJSON(map[string]any{"filename": "logo.png", "content_type": "image/png", "size": size}).
			Expect().Status(http.StatusCreated).JSON().Object().Value("url").String().Raw()
		return strings.TrimPrefix(url, b.url)
	}
	anon := b.expect("")

	path := presign(4)
	anon.PUT(path).WithHeader("Content-Type", "image/png").WithBytes([]byte("12345")).Expect().Status(http.StatusRequestEntityTooLarge)
	anon.PUT(path).WithHeader("Content-Type", "text/plain").WithBytes([]byte("1234")).Expect().Status(http.StatusUnsupportedMediaType)
	anon.PUT(path).WithHeader("Content-Type", "image/png").WithBytes([]byte("1234")).Expect().Status(http.StatusCreated).
		JSON().Object().Value("sha256").IsEqual("03ac674216f3e15c761ee1a5e255f067953623c8b388b4459e13f978d7c846f4")
	anon.PUT(path).WithHeader("Content-Type", "image/png").WithBytes([]byte("1234")).Expect().Status(http.StatusConflict)

	late := presign(4)
	b.clock.Advance(uploadTTL)
	anon.PUT(late).WithHeader("Content-Type", "image/png").WithBytes([]byte("1234")).Expect().Status(http.StatusGone)
	anon.PUT("/uploads/"+strings.Repeat("A", 43)).WithHeader("Content-Type", "image/png").WithBytes([]byte("1")).Expect().Status(http.StatusNotFound)
	anon.PUT("/uploads/short").WithBytes([]byte("1")).Expect().Status(http.StatusBadRequest)
}
