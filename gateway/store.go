package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"hermeshost/atomicfile"
)

// receiptsKept bounds the previous versions of auth.json kept beside it, so a bad
// rotation or login can be undone by hand (see atomicfile.Receipts).
const receiptsKept = 10

// loadCredentials reads auth.json with the strict loader: empty, truncated, unparseable
// or invalid is an *atomicfile.LoadError naming the file, never an empty login.
func loadCredentials(path string) (Credentials, error) {
	var c Credentials
	if err := atomicfile.LoadJSON(path, &c); err != nil {
		return Credentials{}, fmt.Errorf("gateway login: %w", err)
	}
	return c, nil
}

// writeCredentials replaces auth.json atomically, keeping the previous version as a receipt.
func writeCredentials(path string, c Credentials) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("gateway login: encode: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n'), 0o600, atomicfile.WithReceipts(receiptsKept)); err != nil {
		return fmt.Errorf("gateway login: %w", err)
	}
	return nil
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
