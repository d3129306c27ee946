package gateway

import (
	"errors"
	"fmt"
	"io/fs"
)

// errNoAtomicfile stands in until package atomicfile (strict loader, atomic writer with
// receipts) is merged; auth.json is never read or written any other way.
var errNoAtomicfile = errors.New("auth.json storage waits for package atomicfile")

// loadCredentials reads auth.json with the strict loader.
func loadCredentials(path string) (Credentials, error) {
	return Credentials{}, fmt.Errorf("load %s: %w", path, errNoAtomicfile)
}

// writeCredentials replaces auth.json atomically, keeping the previous version as a receipt.
func writeCredentials(path string, _ Credentials) error {
	return fmt.Errorf("write %s: %w", path, errNoAtomicfile)
}

// SaveLogin writes a new login to path for `gateway login`. It refuses to replace a login
// of another identity, or a file it cannot read as a login, unless replace is set; the
// previous file is kept as a receipt either way.
func SaveLogin(path string, c Credentials, replace bool) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("save the gateway login: %w", err)
	}
	on, err := loadCredentials(path)
	switch {
	case replace, errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("%s exists but is not a readable login (%w); refusing to overwrite it without --replace", path, err)
	case on.Identity != c.Identity:
		return fmt.Errorf("%s holds the login of %q, not %q; refusing to overwrite it without --replace: %w", path, on.Identity, c.Identity, ErrIdentityMismatch)
	}
	return writeCredentials(path, c)
}
