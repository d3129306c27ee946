package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// OAuthConfig is how the gateway reaches the provider's OAuth endpoints.
type OAuthConfig struct {
	// TokenURL serves the refresh-token and device-code grants.
	TokenURL string
	// DeviceURL is the device-authorization endpoint (RFC 8628); only login needs it.
	DeviceURL string
	ClientID  string
	Scope     string
	// HTTP is the client for the token endpoint; nil means a client with a 30s timeout.
	HTTP *http.Client
}

func (c OAuthConfig) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 30 * time.Second}
}

// OAuthError is an error answer from the provider's OAuth endpoints (RFC 6749 5.2).
type OAuthError struct {
	Status      int
	Code        string
	Description string
}

func (e *OAuthError) Error() string {
	msg := fmt.Sprintf("oauth: %s (HTTP %d)", e.Code, e.Status)
	if e.Description != "" {
		msg += ": " + e.Description
	}
	return msg
}

// IsInvalidGrant reports whether err is the provider refusing a refresh token or device
// code for good (revoked, expired, or already rotated away): only a new login helps.
func IsInvalidGrant(err error) bool {
	var oe *OAuthError
	return errors.As(err, &oe) && oe.Code == "invalid_grant"
}

// tokenAnswer is a token endpoint's answer (RFC 6749 5.1 and 5.2).
type tokenAnswer struct {
	AccessToken      string `json:"access_token"`
	RefreshToken     string `json:"refresh_token"`
	ExpiresIn        int64  `json:"expires_in"`
	IDToken          string `json:"id_token"`
	Error            string `json:"error"`
	ErrorDescription string `json:"error_description"`
}

// postForm sends a form-encoded POST to an OAuth endpoint and decodes the JSON answer into out.
func (c OAuthConfig) postForm(ctx context.Context, endpoint string, form url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return fmt.Errorf("oauth: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	resp, err := c.client().Do(req)
	if err != nil {
		return fmt.Errorf("oauth: reach %s: %w", redactURL(endpoint), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("oauth: read answer of %s: %w", redactURL(endpoint), err)
	}
	if resp.StatusCode != http.StatusOK {
		var e tokenAnswer
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &OAuthError{Status: resp.StatusCode, Code: e.Error, Description: e.ErrorDescription}
		}
		return &OAuthError{Status: resp.StatusCode, Code: "http_error", Description: http.StatusText(resp.StatusCode)}
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("oauth: answer of %s is not JSON: %w", redactURL(endpoint), err)
	}
	return nil
}

// redactURL drops a URL's query and user info, which may carry secrets, for messages.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// refresh runs the refresh-token grant.
func (c OAuthConfig) refresh(ctx context.Context, refreshToken string) (tokenAnswer, error) {
	form := url.Values{"grant_type": {"refresh_token"}, "refresh_token": {refreshToken}}
	if c.ClientID != "" {
		form.Set("client_id", c.ClientID)
	}
	var a tokenAnswer
	if err := c.postForm(ctx, c.TokenURL, form, &a); err != nil {
		return tokenAnswer{}, fmt.Errorf("refresh the gateway login: %w", err)
	}
	if a.AccessToken == "" {
		return tokenAnswer{}, errors.New("refresh the gateway login: the token endpoint answered without an access token")
	}
	return a, nil
}

// credentials turns a token answer into a login for identity, keeping the previous
// refresh token when the provider does not rotate it.
func (a tokenAnswer) credentials(identity, previousRefresh string, now time.Time) Credentials {
	c := Credentials{
		Version: credentialsVersion, Identity: identity,
		AccessToken: a.AccessToken, RefreshToken: a.RefreshToken, UpdatedAt: now.UTC(),
	}
	if c.RefreshToken == "" {
		c.RefreshToken = previousRefresh
	}
	if a.ExpiresIn > 0 {
		c.ExpiresAt = now.Add(time.Duration(a.ExpiresIn) * time.Second).UTC()
	}
	return c
}

// ErrNoIdentity is a token answer without an id token, so it does not say whose login it is.
var ErrNoIdentity = errors.New("the token endpoint returned no id_token, so the login's identity is unknown (is the openid scope granted?)")

// identityOf is the subject of an id token. The token comes straight from the provider's
// token endpoint over the connection the gateway opened, which OpenID Connect Core 3.1.3.7
// accepts in place of checking its signature.
func identityOf(idToken string) (string, error) {
	if idToken == "" {
		return "", ErrNoIdentity
	}
	parts := strings.Split(idToken, ".")
	if len(parts) != 3 {
		return "", errors.New("the id_token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return "", fmt.Errorf("the id_token payload is not base64url: %w", err)
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Sub == "" {
		return "", errors.New("the id_token has no subject")
	}
	return claims.Sub, nil
}

// DeviceCode is what an operator needs to approve a device login (RFC 8628 3.2).
type DeviceCode struct {
	UserCode                string
	VerificationURI         string
	VerificationURIComplete string
	ExpiresIn               time.Duration
}

// DeviceLogin runs the device authorization grant (RFC 8628): it asks for a code, has show
// tell the operator where to enter it, and polls the token endpoint until the operator
// approves, refuses, or the code expires.
func (c OAuthConfig) DeviceLogin(ctx context.Context, show func(DeviceCode)) (Credentials, error) {
	if c.DeviceURL == "" || c.TokenURL == "" || c.ClientID == "" {
		return Credentials{}, errors.New("device login needs the device-authorization URL, the token URL and the client id")
	}
	form := url.Values{"client_id": {c.ClientID}}
	if c.Scope != "" {
		form.Set("scope", c.Scope)
	}
	var dc struct {
		DeviceCode              string `json:"device_code"`
		UserCode                string `json:"user_code"`
		VerificationURI         string `json:"verification_uri"`
		VerificationURIComplete string `json:"verification_uri_complete"`
		ExpiresIn               int64  `json:"expires_in"`
		Interval                *int64 `json:"interval"`
	}
	if err := c.postForm(ctx, c.DeviceURL, form, &dc); err != nil {
		return Credentials{}, fmt.Errorf("device login: %w", err)
	}
	if dc.DeviceCode == "" || dc.UserCode == "" || dc.VerificationURI == "" {
		return Credentials{}, errors.New("device login: the device-authorization answer lacks device_code, user_code or verification_uri")
	}
	show(DeviceCode{
		UserCode: dc.UserCode, VerificationURI: dc.VerificationURI,
		VerificationURIComplete: dc.VerificationURIComplete, ExpiresIn: time.Duration(dc.ExpiresIn) * time.Second,
	})
	interval := 5 * time.Second // RFC 8628 3.2: the default when the server names none
	if dc.Interval != nil {
		interval = time.Duration(*dc.Interval) * time.Second
	}
	if dc.ExpiresIn > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(dc.ExpiresIn)*time.Second)
		defer cancel()
	}
	poll := url.Values{
		"grant_type":  {"urn:ietf:params:oauth:grant-type:device_code"},
		"device_code": {dc.DeviceCode},
		"client_id":   {c.ClientID},
	}
	for {
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return Credentials{}, fmt.Errorf("device login: no approval before the code expired or the login was stopped: %w", ctx.Err())
		case <-t.C:
		}
		var a tokenAnswer
		err := c.postForm(ctx, c.TokenURL, poll, &a)
		var oe *OAuthError
		switch {
		case errors.As(err, &oe) && oe.Code == "authorization_pending":
			continue
		case errors.As(err, &oe) && oe.Code == "slow_down":
			interval += 5 * time.Second // RFC 8628 3.5
			continue
		case err != nil:
			return Credentials{}, fmt.Errorf("device login: %w", err)
		}
		return loginFrom(a, time.Now())
	}
}

// ExchangeRefreshToken logs in with a refresh token an operator already holds.
func (c OAuthConfig) ExchangeRefreshToken(ctx context.Context, refreshToken string) (Credentials, error) {
	if c.TokenURL == "" {
		return Credentials{}, errors.New("login with a refresh token needs the token URL")
	}
	if strings.TrimSpace(refreshToken) == "" {
		return Credentials{}, errors.New("login with a refresh token: the token read is empty")
	}
	refreshToken = strings.TrimSpace(refreshToken)
	a, err := c.refresh(ctx, refreshToken)
	if err != nil {
		return Credentials{}, err
	}
	if a.RefreshToken == "" {
		a.RefreshToken = refreshToken
	}
	return loginFrom(a, time.Now())
}

func loginFrom(a tokenAnswer, now time.Time) (Credentials, error) {
	id, err := identityOf(a.IDToken)
	if err != nil {
		return Credentials{}, fmt.Errorf("login: %w", err)
	}
	if a.RefreshToken == "" {
		return Credentials{}, errors.New("login: the provider issued no refresh token (is the offline_access scope granted?)")
	}
	return a.credentials(id, "", now), nil
}
