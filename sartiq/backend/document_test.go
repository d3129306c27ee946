package backend

import (
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"

	"hermeshost/service"
)

// documentedOps is every operation of the document by "METHOD path".
func documentedOps(t *testing.T) (*openapi3.T, map[string]*openapi3.Operation) {
	t.Helper()
	doc, err := Document()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops[method+" "+path] = op
		}
	}
	return doc, ops
}

// The document and the router describe the same API: every chi route is a documented
// operation under the operationId it was registered with, and every documented operation
// is routed. Each operation has an operationId and a summary, and its security names the
// tokens the gate actually accepts for it.
func TestDocumentMatchesRouter(t *testing.T) {
	ops := service.NewOps(slog.New(slog.NewJSONHandler(io.Discard, nil)))
	h, err := newHandler(nil, Config{BotToken: "x"}, ops)
	if err != nil {
		t.Fatal(err)
	}
	r := ops.Router()
	h.routes(r)
	_, documented := documentedOps(t)

	routed := map[string]bool{}
	err = chi.Walk(r, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		key := method + " " + route
		routed[key] = true
		op, ok := documented[key]
		if !ok {
			t.Errorf("route %s is not in the OpenAPI document", key)
			return nil
		}
		if registered := h.operations[key]; op.OperationID != registered {
			t.Errorf("route %s: the document calls it %q, the router %q", key, op.OperationID, registered)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for key, op := range documented {
		if !routed[key] {
			t.Errorf("documented operation %s (%s) has no route", key, op.OperationID)
		}
		if op.OperationID == "" || strings.TrimSpace(op.Summary) == "" {
			t.Errorf("%s lacks an operationId or a summary", key)
		}
		seen = append(seen, op.OperationID)
		bot, job := false, false
		if op.Security != nil {
			for _, req := range *op.Security {
				_, b := req["botToken"]
				_, j := req["jobToken"]
				bot, job = bot || b, job || j
			}
		}
		grantedToJobs := false
		for _, allowed := range jobTokenAllowlist {
			grantedToJobs = grantedToJobs || allowed[op.OperationID]
		}
		if bot != botOperations[op.OperationID] || job != grantedToJobs {
			t.Errorf("%s: the document says bot=%v job=%v, the gate bot=%v job=%v",
				op.OperationID, bot, job, botOperations[op.OperationID], grantedToJobs)
		}
	}
	sort.Strings(seen)
	for i := 1; i < len(seen); i++ {
		if seen[i] == seen[i-1] {
			t.Errorf("operationId %s is used twice", seen[i])
		}
	}
	if len(routed) != len(documented) || len(documented) < 19 {
		t.Errorf("%d routes, %d documented operations", len(routed), len(documented))
	}
}

func TestDocumentIsServed(t *testing.T) {
	b := startBackend(t)
	body := b.expect("").GET("/openapi.json").Expect().Status(http.StatusOK).HasContentType("application/json").Body().Raw()
	doc, err := openapi3.NewLoader().LoadFromData([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if doc.Paths.Find("/agent-jobs/{id}/claim").Post.OperationID != "claimAgentJob" {
		t.Fatal("served document lacks claimAgentJob")
	}
}
