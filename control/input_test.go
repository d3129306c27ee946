package control

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gavv/httpexpect/v2"
)

func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	f := newFixture(t)
	a := f.as(orgA)
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "home:acme", "holder": "worker-1", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	a.POST("/v1/leases/acquire").WithJSON(acquireBody{"key": "session:x", "holder": "worker-1", "ttl_ms": 60000}).
		Expect().Status(http.StatusOK)
	f.addJob(orgA, "job-1", f.now(), 2)
	before := f.snapshot()

	const json = "application/json"
	long := strings.Repeat("h", 201)
	sql := "x' OR '1'='1"
	cases := []refusal{
		{"text/plain body", "POST", "/v1/leases/acquire", "text/plain", `{"key":"home:acme","holder":"w","ttl_ms":1000}`, 415},
		{"form body", "POST", "/v1/leases/release", "application/x-www-form-urlencoded", `key=home:acme&holder=worker-1&epoch=1`, 415},
		{"no content type", "POST", "/v1/leases/refresh", "", `{"key":"home:acme","holder":"worker-1","epoch":1,"ttl_ms":1000}`, 415},
		{"2 MiB body", "POST", "/v1/leases/acquire", json, `{"key":"home:acme","holder":"` + strings.Repeat("a", 2<<20) + `","ttl_ms":1000}`, 413},
		{"just over 64 KiB", "POST", "/v1/leases/release", json, `{"key":"home:acme","holder":"worker-1","epoch":1}` + strings.Repeat(" ", MaxBody), 413},
		{"empty body", "POST", "/v1/leases/acquire", json, ``, 400},
		{"malformed JSON", "POST", "/v1/leases/acquire", json, `{"key":"home:acme",`, 400},
		{"not JSON at all", "POST", "/v1/leases/acquire", json, `key=home:acme`, 400},
		{"an array", "POST", "/v1/leases/acquire", json, `[{"key":"home:acme"}]`, 400},
		{"unknown field", "POST", "/v1/leases/acquire", json, `{"key":"home:acme","holder":"w","ttl_ms":1000,"org":"globex"}`, 400},
		{"trailing data", "POST", "/v1/leases/release", json, `{"key":"home:acme","holder":"worker-1","epoch":1}{"key":"home:acme"}`, 400},
		{"ttl as a string", "POST", "/v1/leases/acquire", json, `{"key":"home:acme","holder":"w","ttl_ms":"1000"}`, 400},
		{"ttl as a fraction", "POST", "/v1/leases/acquire", json, `{"key":"home:acme","holder":"w","ttl_ms":1.5}`, 400},
		{"epoch as a string", "POST", "/v1/leases/release", json, `{"key":"home:acme","holder":"worker-1","epoch":"1"}`, 400},
		{"key as a number", "POST", "/v1/leases/acquire", json, `{"key":5,"holder":"w","ttl_ms":1000}`, 400},
		{"ttl 0", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w","ttl_ms":0}`, 400},
		{"ttl missing", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w"}`, 400},
		{"ttl negative", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w","ttl_ms":-1}`, 400},
		{"ttl over 24h", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w","ttl_ms":86400001}`, 400},
		{"ttl that overflows", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w","ttl_ms":9223372036854775807}`, 400},
		{"refresh ttl over 24h", "POST", "/v1/leases/refresh", json, `{"key":"home:acme","holder":"worker-1","epoch":1,"ttl_ms":86400001}`, 400},
		{"holder empty", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"","ttl_ms":1000}`, 400},
		{"holder too long", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"` + long + `","ttl_ms":1000}`, 400},
		{"holder with a NUL", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w\u0000","ttl_ms":1000}`, 400},
		{"release holder too long", "POST", "/v1/leases/release", json, `{"key":"home:acme","holder":"` + long + `","epoch":1}`, 400},
		{"key empty", "POST", "/v1/leases/acquire", json, `{"key":"","holder":"w","ttl_ms":1000}`, 400},
		{"key traversal", "POST", "/v1/leases/acquire", json, `{"key":"../x","holder":"w","ttl_ms":1000}`, 400},
		{"session traversal", "POST", "/v1/leases/acquire", json, `{"key":"session:../x","holder":"w","ttl_ms":1000}`, 400},
		{"home traversal", "POST", "/v1/leases/acquire", json, `{"key":"home:acme/../globex","holder":"w","ttl_ms":1000}`, 400},
		{"SQL in a key", "POST", "/v1/leases/acquire", json, `{"key":"session:` + sql + `","holder":"w","ttl_ms":1000}`, 400},
		{"unknown namespace", "POST", "/v1/leases/acquire", json, `{"key":"user:x","holder":"w","ttl_ms":1000}`, 400},
		{"session id too long once scoped", "POST", "/v1/leases/acquire", json, `{"key":"session:` + strings.Repeat("s", 196) + `","holder":"w","ttl_ms":1000}`, 400},
		{"wait over the maximum", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w","ttl_ms":1000,"wait_ms":5001}`, 400},
		{"wait negative", "POST", "/v1/leases/acquire", json, `{"key":"session:y","holder":"w","ttl_ms":1000,"wait_ms":-1}`, 400},
		{"refresh epoch 0", "POST", "/v1/leases/refresh", json, `{"key":"home:acme","holder":"worker-1","epoch":0,"ttl_ms":1000}`, 400},
		{"release epoch missing", "POST", "/v1/leases/release", json, `{"key":"home:acme","holder":"worker-1"}`, 400},
		{"release epoch negative", "POST", "/v1/leases/release", json, `{"key":"home:acme","holder":"worker-1","epoch":-1}`, 400},
		{"show traversal", "GET", "/v1/leases/" + url.PathEscape("../x"), "", "", 400},
		{"show SQL", "GET", "/v1/leases/" + url.PathEscape("home:"+sql), "", "", 400},
		{"show bad escape", "GET", "/v1/leases/home:acme%zz", "", "", 400},
		{"job traversal", "GET", "/v1/jobs/" + url.PathEscape("../job-1"), "", "", 404},
		{"job SQL", "GET", "/v1/jobs/" + url.PathEscape(sql), "", "", 404},
		{"jobs limit 0", "GET", "/v1/jobs?limit=0", "", "", 400},
		{"jobs limit 201", "GET", "/v1/jobs?limit=201", "", "", 400},
		{"jobs limit not a number", "GET", "/v1/jobs?limit=" + url.QueryEscape(sql), "", "", 400},
		{"jobs cursor garbage", "GET", "/v1/jobs?cursor=" + url.QueryEscape(sql), "", "", 400},
		{"jobs cursor not ours", "GET", "/v1/jobs?cursor=eyJ4IjoxfQ", "", "", 400},
		{"delete a lease", "DELETE", "/v1/leases/home:acme", "", "", 405},
	}
	expectRefusals(t, a, cases)
	if after := f.snapshot(); after != before {
		t.Fatalf("a refused request wrote:\n%s\nthen\n%s", before, after)
	}
}

// refusal is a request the API must refuse with want, in its error shape.
type refusal struct {
	name, method, path, contentType, body string
	want                                  int
}

// expectRefusals sends each case with a and checks the status and the {error, message} body.
func expectRefusals(t *testing.T, a *httpexpect.Expect, cases []refusal) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path, query, _ := strings.Cut(c.path, "?")
			req := a.Request(c.method, path).WithQueryString(query)
			if c.body != "" || c.method == "POST" {
				req = req.WithBytes([]byte(c.body))
			}
			if c.contentType != "" {
				req = req.WithHeader("Content-Type", c.contentType)
			}
			obj := req.Expect().Status(c.want).JSON().Object()
			obj.Keys().ContainsOnly("error", "message")
			obj.Value("message").String().NotEmpty()
		})
	}
}
