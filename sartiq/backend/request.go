package backend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"hermeshost/sartiq"
)

// Identifiers are checked before they reach SQL or a URL, so traversal and metacharacters
// are a 400 that changes nothing.
var (
	uuidPattern      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	orgPattern       = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	categoryPattern  = orgPattern
	uploadKeyPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`)
	skuPattern       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	eventKindPattern = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,62}$`)
	filenamePattern  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	mediaTypePattern = regexp.MustCompile(`^[a-z]+/[a-z0-9][a-z0-9.+-]{0,99}$`)
)

// pathParams are a route's validated path parameters.
type pathParams struct {
	jobID     string
	org       string
	category  string
	uploadKey string
}

// set validates one chi URL parameter into p.
func (p *pathParams) set(name, value string) error {
	check := func(re *regexp.Regexp, what string, dst *string) error {
		if !re.MatchString(value) {
			return badRequest("%s %q is not valid", what, clip(value))
		}
		*dst = value
		return nil
	}
	switch name {
	case "id":
		value = strings.ToLower(value)
		return check(uuidPattern, "job id", &p.jobID)
	case "org":
		return check(orgPattern, "organization id", &p.org)
	case "category":
		return check(categoryPattern, "category", &p.category)
	case "key":
		return check(uploadKeyPattern, "upload key", &p.uploadKey)
	}
	return fmt.Errorf("route has an unknown path parameter %q", name)
}

// clip keeps echoed input short and printable in messages.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// decodeBody reads one JSON value into dst: at most maxBodyBytes (413), JSON only (415),
// no unknown fields and nothing after the value (400). An empty body leaves dst as it is
// when optional, and is a 400 otherwise.
func decodeBody(r *http.Request, dst any, optional bool) error {
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil {
		return badRequest("could not read the request body")
	}
	if len(raw) > maxBodyBytes {
		return failf(http.StatusRequestEntityTooLarge, "body_too_large", "the request body is larger than %d bytes", maxBodyBytes)
	}
	return decodeJSON(r.Header.Get("Content-Type"), raw, dst, optional)
}

// decodeJSON is decodeBody's parsing, apart from reading, so that it can be fuzzed.
func decodeJSON(contentType string, raw []byte, dst any, optional bool) error {
	if len(bytes.TrimSpace(raw)) == 0 {
		if optional {
			return nil
		}
		return badRequest("a JSON request body is required")
	}
	if contentType != "" {
		mt, _, err := mime.ParseMediaType(contentType)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return failf(http.StatusUnsupportedMediaType, "unsupported_media_type", "the request body must be application/json")
		}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return badRequest("the request body is not valid: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("the request body has data after its JSON value")
	}
	return nil
}

// jsonProblem describes a decoding error without echoing the input.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %q must be %s", typ.Field, typ.Type.String())
		}
		return fmt.Sprintf("must be %s", typ.Type.String())
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON (unexpected end)"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + clip(strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return "malformed JSON"
}

// Validation of each request body, in one place.

const (
	maxMessage  = 4096
	maxJSONBlob = 64 << 10
)

func checkText(field, s string, min, max int) error {
	if !utf8.ValidString(s) {
		return badRequest("%s must be UTF-8 text", field)
	}
	if n := utf8.RuneCountInString(s); n < min || n > max {
		if min > 0 && n == 0 {
			return badRequest("%s is required", field)
		}
		return badRequest("%s must be at most %d characters", field, max)
	}
	return nil
}

// checkObject accepts an absent value, null (when nullable) or a JSON object of bounded size.
func checkObject(field string, raw json.RawMessage, required bool) error {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		if required {
			return badRequest("%s is required (a JSON object)", field)
		}
		return nil
	}
	if t[0] != '{' {
		return badRequest("%s must be a JSON object", field)
	}
	if len(t) > maxJSONBlob {
		return badRequest("%s must be at most %d bytes", field, maxJSONBlob)
	}
	return nil
}

// reservedEventKinds are written by the backend alone: a worker cannot forge an attempt.
var reservedEventKinds = set(sartiq.EventClaim, sartiq.EventReclaim, sartiq.EventStart, sartiq.EventHeartbeat,
	sartiq.EventProgress, sartiq.EventComplete, sartiq.EventFail, sartiq.EventRelease, sartiq.EventProposal)

func validateHeartbeat(req *sartiq.HeartbeatRequest) error {
	return checkObject("progress", req.Progress, false)
}

func validateEvent(req *sartiq.EventRequest) error {
	if !eventKindPattern.MatchString(req.Kind) {
		return badRequest("kind must match %s", eventKindPattern)
	}
	if reservedEventKinds[req.Kind] {
		return badRequest("kind %q is written by the backend itself", req.Kind)
	}
	if err := checkText("message", req.Message, 0, maxMessage); err != nil {
		return err
	}
	return checkObject("data", req.Data, false)
}

func validateComplete(req *sartiq.CompleteRequest) error {
	return checkObject("result", req.Result, true)
}

func validateFail(req *sartiq.FailRequest) error {
	return checkText("reason", req.Reason, 1, maxMessage)
}

func validateRelease(req *sartiq.ReleaseRequest) error {
	return checkText("reason", req.Reason, 0, maxMessage)
}

const maxProductsPerProposal = 100

func validateProductProposals(req *sartiq.ProductProposalsRequest) error {
	if len(req.Products) == 0 || len(req.Products) > maxProductsPerProposal {
		return badRequest("products must list 1 to %d products", maxProductsPerProposal)
	}
	seen := map[string]bool{}
	for i, p := range req.Products {
		if !skuPattern.MatchString(p.SKU) {
			return badRequest("products[%d].sku must match %s", i, skuPattern)
		}
		if seen[p.SKU] {
			return badRequest("products[%d].sku %q is listed twice", i, p.SKU)
		}
		seen[p.SKU] = true
		if err := checkText(fmt.Sprintf("products[%d].name", i), p.Name, 1, 200); err != nil {
			return err
		}
		if err := checkText(fmt.Sprintf("products[%d].description", i), p.Description, 0, 10000); err != nil {
			return err
		}
		if err := checkObject(fmt.Sprintf("products[%d].attributes", i), p.Attributes, false); err != nil {
			return err
		}
	}
	return nil
}

func validateGuidelines(req *sartiq.GuidelinesRequest) error {
	if err := checkText("content", req.Content, 1, 200000); err != nil {
		return err
	}
	if len(req.Sources) > 50 {
		return badRequest("sources must list at most 50 entries")
	}
	for i, s := range req.Sources {
		if err := checkText(fmt.Sprintf("sources[%d]", i), s, 1, 2048); err != nil {
			return err
		}
	}
	return nil
}

func validatePresign(req *sartiq.PresignRequest) error {
	if !filenamePattern.MatchString(req.Filename) {
		return badRequest("filename must match %s", filenamePattern)
	}
	if !mediaTypePattern.MatchString(req.ContentType) {
		return badRequest("content_type must be a media type such as image/png")
	}
	if req.Size < 1 || req.Size > MaxUploadBytes {
		return badRequest("size must be 1 to %d bytes", MaxUploadBytes)
	}
	return nil
}

// queryInt reads an optional whole-number query parameter within [1, max].
func queryInt(r *http.Request, name string, def, max int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > max {
		return 0, badRequest("%s must be a whole number from 1 to %d", name, max)
	}
	return n, nil
}
