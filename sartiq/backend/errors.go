package backend

import (
	"errors"
	"fmt"
	"net/http"

	"hermeshost/service"
)

// apiError is an answer other than success: its status and the {error, message} body.
// Handlers return one; anything else they return is logged and answered as a plain 500.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

func failf(status int, code, format string, a ...any) *apiError {
	return &apiError{status: status, code: code, message: fmt.Sprintf(format, a...)}
}

func badRequest(format string, a ...any) *apiError {
	return failf(http.StatusBadRequest, "bad_request", format, a...)
}

func conflict(code, format string, a ...any) *apiError {
	return failf(http.StatusConflict, code, format, a...)
}

func notFound(format string, a ...any) *apiError {
	return failf(http.StatusNotFound, "not_found", format, a...)
}

func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, op string, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		service.WriteError(w, ae.status, ae.code, ae.message)
		return
	}
	h.log.Error("request failed", "op", op, "method", r.Method, "route", routePattern(r), "err", err.Error())
	service.WriteError(w, http.StatusInternalServerError, "internal", "internal error")
}
