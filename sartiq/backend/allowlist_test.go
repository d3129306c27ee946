package backend

import (
	"net/http"
	"strings"
	"testing"

	"hermeshost/sartiq"
)

// pathFor fills a documented path template with the given values.
func pathFor(template string, values map[string]string) string {
	for k, v := range values {
		template = strings.ReplaceAll(template, "{"+k+"}", v)
	}
	return template
}

// Every gated operation a capability's token is not granted is 403, whatever the path
// says; granted operations on another job or another organization are 403 too; the bot
// token cannot use the job endpoints. None of it changes anything.
func TestJobTokensPassOnlyTheirAllowlist(t *testing.T) {
	b := startBackend(t)
	_, documented := documentedOps(t)
	ingest := b.demoJob("acme", sartiq.TypeProductIngest)
	guidelines := b.demoJob("acme", sartiq.TypeGuidelinesExtraction)
	otherJob := b.demoJob("globex", sartiq.TypeProductIngest)
	tokens := map[string]string{ingest: b.claim(ingest), guidelines: b.claim(guidelines)}
	b.claim(otherJob)
	capability := map[string]string{ingest: sartiq.TypeProductIngest, guidelines: sartiq.TypeGuidelinesExtraction}
	before := b.snapshot()

	for jobID, token := range tokens {
		job := b.expect(token)
		own := map[string]string{"id": jobID, "org": "acme", "category": DemoCategories[0]}
		for key, op := range documented {
			method, template, _ := strings.Cut(key, " ")
			if op.Security != nil && len(*op.Security) == 0 {
				continue // public: the document, health, metrics, presigned PUT
			}
			allowed := jobTokenAllowlist[capability[jobID]][op.OperationID]
			if !allowed {
				job.Request(method, pathFor(template, own)).WithJSON(map[string]any{}).
					Expect().Status(http.StatusForbidden).JSON().Object().Value("error").IsEqual("not_allowed")
				continue
			}
			if strings.Contains(template, "{id}") {
				job.Request(method, pathFor(template, map[string]string{"id": otherJob})).WithJSON(map[string]any{}).
					Expect().Status(http.StatusForbidden).JSON().Object().Value("error").IsEqual("other_job")
			}
			if strings.Contains(template, "{org}") {
				other := map[string]string{"org": "globex", "category": DemoCategories[0]}
				job.Request(method, pathFor(template, other)).WithJSON(map[string]any{}).
					Expect().Status(http.StatusForbidden).JSON().Object().Value("error").IsEqual("other_org")
			}
		}
	}
	for key, op := range documented {
		method, template, _ := strings.Cut(key, " ")
		if op.Security != nil && len(*op.Security) == 0 || botOperations[op.OperationID] {
			continue
		}
		b.bot().Request(method, pathFor(template, map[string]string{"id": ingest, "org": "acme", "category": DemoCategories[0]})).
			WithJSON(map[string]any{}).Expect().Status(http.StatusForbidden)
	}
	b.unchanged(before)

	metrics := b.expect("").GET("/metrics").Expect().Body().Raw()
	for _, reason := range []string{"not_allowed", "other_job", "other_org"} {
		if !strings.Contains(metrics, `sartiq_backend_token_denials_total{reason="`+reason+`"}`) {
			t.Errorf("metrics lack denials for %s", reason)
		}
	}
}

func TestMissingAndUnknownTokensAre401(t *testing.T) {
	b := startBackend(t)
	id := b.demoJob("acme", sartiq.TypeProductIngest)
	before := b.snapshot()
	b.expect("").POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusUnauthorized).JSON().Object().Value("error").IsEqual("missing_token")
	b.expect("not-a-token").POST("/agent-jobs/{id}/claim", id).Expect().Status(http.StatusUnauthorized).JSON().Object().Value("error").IsEqual("invalid_token")
	b.expect(testBotToken + "x").GET("/agent-jobs").Expect().Status(http.StatusUnauthorized)
	b.unchanged(before)
}
