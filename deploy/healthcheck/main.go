// Command hermes-healthcheck is the container health check of the host's images: it asks
// one /healthz and exits 0 when it answers 200, else 1 with the reason on one line. The
// images have no shell, curl or wget (distroless, or FROM scratch), so the compose file's
// healthchecks run this.
//
//	hermes-healthcheck http://127.0.0.1:8091/healthz
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// timeout bounds the whole check; the engine's own timeout is the backstop.
const timeout = 5 * time.Second

func main() {
	if err := check(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "hermes-healthcheck:", err)
		os.Exit(1)
	}
}

func check(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: hermes-healthcheck URL (for example http://127.0.0.1:8091/healthz)")
	}
	u, err := url.Parse(args[0])
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http URL", args[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	// /healthz says which checks fail; the first line is enough for `docker inspect`.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	reason, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
	return fmt.Errorf("%s answered %s: %s", u, resp.Status, reason)
}
