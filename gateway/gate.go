package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// MissingModelsError is a gateway that is up but does not serve a model the host needs.
// Worker and Vision name the missing models ("" when served).
type MissingModelsError struct {
	Worker, Vision string
	Served         []string
}

func (e *MissingModelsError) Error() string {
	var missing []string
	if e.Worker != "" {
		missing = append(missing, fmt.Sprintf("the worker model %q", e.Worker))
	}
	if e.Vision != "" {
		missing = append(missing, fmt.Sprintf("the vision model %q", e.Vision))
	}
	served := strings.Join(e.Served, ", ")
	if served == "" {
		served = "no models"
	}
	return fmt.Sprintf("gateway does not serve %s (it serves %s)", strings.Join(missing, " or "), served)
}

// Gate asks the gateway at gatewayURL, with key, whether it is up and serves both the
// worker and the vision model. The dispatcher neither polls nor claims unless it is nil;
// the error says what is wrong: unreachable, the key refused, or which model is missing
// (a *MissingModelsError). A nil client means one with a 10s timeout.
func Gate(ctx context.Context, client *http.Client, gatewayURL, key, workerModel, visionModel string) error {
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(gatewayURL, "/")+"/v1/models", nil)
	if err != nil {
		return fmt.Errorf("gateway gate: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("gateway gate: gateway at %s unreachable: %w", redactURL(gatewayURL), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("gateway gate: read the model list: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &e)
		return fmt.Errorf("gateway gate: /v1/models answered %d: %s", resp.StatusCode, e.Error.Message)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return fmt.Errorf("gateway gate: the model list is not JSON: %w", err)
	}
	missing := &MissingModelsError{Worker: workerModel, Vision: visionModel}
	for _, m := range list.Data {
		missing.Served = append(missing.Served, m.ID)
		if m.ID == workerModel {
			missing.Worker = ""
		}
		if m.ID == visionModel {
			missing.Vision = ""
		}
	}
	if missing.Worker != "" || missing.Vision != "" {
		return missing
	}
	return nil
}
