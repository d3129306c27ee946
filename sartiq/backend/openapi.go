package backend

import (
	"context"
	_ "embed"
	"fmt"
	"net/http"

	"github.com/getkin/kin-openapi/openapi3"
)

// openapiYAML is the API's document, written by hand beside the code it describes; the
// package's tests hold the two together (every route documented, every operation routed).
//
//go:embed openapi.yaml
var openapiYAML []byte

// documentJSON loads and validates the document once, as the JSON /openapi.json serves.
func documentJSON() ([]byte, error) {
	doc, err := Document()
	if err != nil {
		return nil, err
	}
	b, err := doc.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode the OpenAPI document: %w", err)
	}
	return b, nil
}

// Document is the backend's OpenAPI document, loaded and validated.
func Document() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(openapiYAML)
	if err != nil {
		return nil, fmt.Errorf("load the OpenAPI document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("the OpenAPI document is invalid: %w", err)
	}
	return doc, nil
}

// getOpenAPIDocument serves the document.
func (h *Handler) getOpenAPIDocument(w http.ResponseWriter, _ *http.Request, _ *call) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(h.doc)
	return nil
}
