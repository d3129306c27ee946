package atomicfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// testCredentials has the shape of the gateway's auth.json.
type testCredentials struct {
	AccessToken  string    `json:"access_token"`
	RefreshToken string    `json:"refresh_token"`
	ExpiresAt    time.Time `json:"expires_at"`
	Account      struct {
		ID    string `json:"id"`
		Email string `json:"email"`
	} `json:"account"`
	Scopes []string `json:"scopes"`
}

func (c *testCredentials) Validate() error {
	if c.RefreshToken == "" {
		return errors.New("refresh_token is missing")
	}
	return nil
}

// validCredentials is a well-formed auth.json, with a non-ASCII character so
// that truncation can fall inside one.
var validCredentials = []byte(`{
  "access_token": "at-7f3a",
  "refresh_token": "rt-91c2",
  "expires_at": "2026-01-02T15:04:05Z",
  "account": {"id": "acct-1", "email": "zoë@example.com"},
  "scopes": ["chat", "tools"]
}
`)

// fixtureTime is the mtime fixtures get, far enough in the past that any
// write by the loader would show.
var fixtureTime = time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)

func writeFixture(t testing.TB, dir string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, fixtureTime, fixtureTime); err != nil {
		t.Fatal(err)
	}
	return path
}

func assertUntouched(t testing.TB, path string, data []byte) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatalf("after loading: %v", err)
	}
	if !info.ModTime().Equal(fixtureTime) {
		t.Fatalf("loading changed the mtime of %s to %v", path, info.ModTime())
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("loading changed %s: %q, was %q", path, got, data)
	}
}

// sentinelCredentials is what v holds before a load that must fail; it must
// hold it after, too.
func sentinelCredentials() testCredentials {
	return testCredentials{AccessToken: "untouched"}
}

// loadFailing loads data and checks that the load fails with a *LoadError of
// kind, that v and the file are untouched, and that the message names the
// file and says each of words.
func loadFailing(t *testing.T, data []byte, kind error, words []string, opts ...LoadOption) *LoadError {
	t.Helper()
	path := writeFixture(t, t.TempDir(), data)
	creds := sentinelCredentials()
	err := LoadJSON(path, &creds, opts...)
	var lerr *LoadError
	if !errors.As(err, &lerr) {
		t.Fatalf("LoadJSON = %v (%T), want a *LoadError", err, err)
	}
	if !errors.Is(err, kind) {
		t.Fatalf("LoadJSON = %v (kind %v), want kind %v", err, lerr.Kind, kind)
	}
	if lerr.Path != path || !strings.HasPrefix(err.Error(), "load "+path+": ") {
		t.Fatalf("message %q does not start by naming %s", err, path)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("message %q does not say %q", err, w)
		}
	}
	if !reflect.DeepEqual(creds, sentinelCredentials()) {
		t.Fatalf("a failed load changed v to %+v", creds)
	}
	assertUntouched(t, path, data)
	return lerr
}

func TestLoadJSONValid(t *testing.T) {
	path := writeFixture(t, t.TempDir(), validCredentials)
	creds := sentinelCredentials()
	if err := LoadJSON(path, &creds); err != nil {
		t.Fatal(err)
	}
	want := testCredentials{
		AccessToken:  "at-7f3a",
		RefreshToken: "rt-91c2",
		ExpiresAt:    time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC),
		Scopes:       []string{"chat", "tools"},
	}
	want.Account.ID = "acct-1"
	want.Account.Email = "zoë@example.com"
	if !reflect.DeepEqual(creds, want) {
		t.Fatalf("loaded %+v, want %+v", creds, want)
	}
	assertUntouched(t, path, validCredentials)
}

func TestLoadJSONMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	var creds testCredentials
	err := LoadJSON(path, &creds)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("LoadJSON of a missing file = %v, want fs.ErrNotExist", err)
	}
	if errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), path) {
		t.Fatalf("missing file reported as %q", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("loading created %s", path)
	}
}

func TestLoadJSONRefusesEmptiness(t *testing.T) {
	loadFailing(t, nil, ErrEmpty, []string{"is empty (0 bytes): refusing to treat it as no credentials"})
	loadFailing(t, []byte(" \n\t\r\n"), ErrEmpty, []string{"only whitespace (5 bytes)", "refusing to treat it as no credentials"})
	loadFailing(t, []byte(" null\n"), ErrEmpty, []string{"only JSON null", "refusing to treat it as no credentials"})
}

func TestLoadJSONTruncatedAtEveryOffset(t *testing.T) {
	end := bytes.LastIndexByte(validCredentials, '}') + 1
	for offset := 0; offset < end; offset++ {
		data := validCredentials[:offset]
		if offset == 0 {
			loadFailing(t, data, ErrEmpty, []string{"is empty (0 bytes)"})
			continue
		}
		lerr := loadFailing(t, data, ErrTruncated, []string{"is truncated", fmt.Sprintf("byte offset %d", offset)})
		if lerr.Offset != int64(offset) {
			t.Fatalf("truncated at %d: Offset %d", offset, lerr.Offset)
		}
		if !utf8.Valid(data) && !strings.Contains(lerr.Error(), "middle of a UTF-8 character") {
			t.Fatalf("truncated inside ë at %d: %q does not say so", offset, lerr)
		}
	}
}

func TestLoadJSONInvalidUTF8(t *testing.T) {
	at := int64(bytes.Index(validCredentials, []byte("7f3a")))
	for name, bad := range map[string][]byte{
		"stray byte":        {0xff},
		"overlong slash":    {0xc0, 0xaf},
		"UTF-16 surrogate":  {0xed, 0xa0, 0x80},
		"cut-off character": {0xc3, 'x'},
	} {
		t.Run(name, func(t *testing.T) {
			data := bytes.Replace(validCredentials, []byte("7f3a"), append(bad, "7f3a"...), 1)
			lerr := loadFailing(t, data, ErrInvalidUTF8, []string{"is not valid UTF-8", fmt.Sprintf("byte offset %d (line 2, column %d)", at, at-1)})
			if lerr.Offset != at {
				t.Fatalf("Offset %d, want %d", lerr.Offset, at)
			}
		})
	}
}

func TestLoadJSONSyntaxErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		data   string
		offset int64
		words  string
	}{
		{"single quotes", `{"access_token": 'x'}`, 17, "line 1, column 18"},
		{"missing comma", "{\n  \"a\": 1\n  \"b\": 2\n}", 13, "line 3, column 3"},
		{"zero-filled, as a crash can leave a file", string(make([]byte, 4096)), 0, "invalid character"},
		{"byte-order mark", "\ufeff{}", 0, "line 1, column 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lerr := loadFailing(t, []byte(tc.data), ErrSyntax, []string{"is not valid JSON", tc.words})
			if lerr.Offset != tc.offset {
				t.Fatalf("Offset %d, want %d", lerr.Offset, tc.offset)
			}
			var syntaxErr *json.SyntaxError
			if !errors.As(lerr, &syntaxErr) {
				t.Fatalf("%v does not wrap the *json.SyntaxError", lerr)
			}
		})
	}
}

func TestLoadJSONWrongTypes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		from  string
		to    string
		field string
		words []string
	}{
		{"string for a list", `["chat", "tools"]`, `"chat tools"`, "scopes", []string{`field "scopes"`, "JSON string", "[]string"}},
		{"number in a nested object", `"acct-1"`, `42`, "account.id", []string{`field "account.id"`, "JSON number", "string"}},
		{"unparseable time", `"2026-01-02T15:04:05Z"`, `"tomorrow"`, "", []string{"does not fit its field", `"tomorrow"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := bytes.Replace(validCredentials, []byte(tc.from), []byte(tc.to), 1)
			lerr := loadFailing(t, data, ErrWrongType, tc.words)
			if lerr.Field != tc.field {
				t.Fatalf("Field %q, want %q", lerr.Field, tc.field)
			}
			// encoding/json places a type error at the end of the value.
			wantOffset := int64(bytes.Index(data, []byte(tc.to)) + len(tc.to))
			if tc.field == "" {
				wantOffset = -1
			}
			if lerr.Offset != wantOffset {
				t.Fatalf("Offset %d, want %d", lerr.Offset, wantOffset)
			}
		})
	}
	loadFailing(t, []byte(`  ["at-7f3a"]`), ErrWrongType, []string{"JSON array at the top level", "byte offset 3"})
}

func TestLoadJSONUnknownFields(t *testing.T) {
	data := bytes.Replace(validCredentials, []byte(`"scopes"`), []byte(`"refresh_tokn": "typo", "scopes"`), 1)
	lerr := loadFailing(t, data, ErrUnknownField, []string{`unknown field "refresh_tokn"`}, WithDisallowUnknownFields())
	if lerr.Field != "refresh_tokn" {
		t.Fatalf("Field %q, want refresh_tokn", lerr.Field)
	}
	// Without the option an unknown field is allowed, as in encoding/json.
	path := writeFixture(t, t.TempDir(), data)
	var creds testCredentials
	if err := LoadJSON(path, &creds); err != nil {
		t.Fatal(err)
	}
}

func TestLoadJSONTrailingData(t *testing.T) {
	body := bytes.TrimSpace(validCredentials)
	for name, tail := range map[string]string{
		"garbage":             "garbage",
		"a second object":     "\n{}",
		"a comma":             " ,",
		"a duplicated ending": "\n}\n",
		"a second number":     "0",
	} {
		t.Run(name, func(t *testing.T) {
			data := append(append([]byte{}, body...), tail...)
			offset := int64(len(body) + len(tail) - len(strings.TrimLeft(tail, " \n")))
			lerr := loadFailing(t, data, ErrTrailingData, []string{"has data after the JSON value", fmt.Sprintf("byte offset %d", offset)})
			if lerr.Offset != offset {
				t.Fatalf("Offset %d, want %d", lerr.Offset, offset)
			}
		})
	}
}

func TestLoadJSONTooLarge(t *testing.T) {
	loadFailing(t, validCredentials, ErrTooLarge, []string{fmt.Sprintf("is %d bytes, more than the 64-byte limit", len(validCredentials))}, WithMaxSize(64))
	// The default limit, hit by whitespace that would otherwise be "empty".
	loadFailing(t, bytes.Repeat([]byte{' '}, DefaultMaxSize+1), ErrTooLarge, []string{"more than the 1048576-byte limit"})
}

func TestLoadJSONValidateHook(t *testing.T) {
	data := bytes.Replace(validCredentials, []byte(`"refresh_token": "rt-91c2",`), nil, 1)
	loadFailing(t, data, ErrInvalid, []string{"failed validation: refresh_token is missing"})
	loadFailing(t, []byte("{}"), ErrInvalid, []string{"refresh_token is missing"})
}

func TestLoadJSONNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	var creds testCredentials
	err := LoadJSON(dir, &creds)
	if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("LoadJSON of a directory = %v", err)
	}
}

func TestLoadJSONNeedsAPointer(t *testing.T) {
	path := writeFixture(t, t.TempDir(), validCredentials)
	for _, v := range []any{nil, testCredentials{}, (*testCredentials)(nil)} {
		if err := LoadJSON(path, v); err == nil || !strings.Contains(err.Error(), "non-nil pointer") {
			t.Fatalf("LoadJSON into %T = %v", v, err)
		}
	}
}

// FuzzLoadJSON checks that no content makes LoadJSON panic, accept what is
// not one valid JSON document, fail without saying which kind of damage it
// found, change v on failure, or change the file.
func FuzzLoadJSON(f *testing.F) {
	f.Add(validCredentials)
	f.Add([]byte{})
	f.Add([]byte("null"))
	f.Add(validCredentials[:len(validCredentials)/2])
	f.Add(append(bytes.TrimSpace(validCredentials), "x"...))
	f.Add([]byte("{\"refresh_token\": \"\xff\"}"))
	f.Add([]byte(`{"refresh_token": "r", "scopes": "x"}`))
	f.Add([]byte(`{"refresh_token": "r", "expires_at": "soon"}`))
	f.Add(make([]byte, 64))
	kinds := []error{ErrTooLarge, ErrEmpty, ErrInvalidUTF8, ErrTruncated, ErrSyntax, ErrWrongType, ErrUnknownField, ErrTrailingData, ErrInvalid}
	// Damage the JSON scanner itself can see, and damage it cannot.
	malformed := []error{ErrEmpty, ErrTruncated, ErrSyntax, ErrTrailingData}
	wellFormed := []error{ErrWrongType, ErrUnknownField, ErrInvalid}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := writeFixture(t, dir, data)
		creds := sentinelCredentials()
		err := LoadJSON(path, &creds, WithMaxSize(4096), WithDisallowUnknownFields())
		assertUntouched(t, path, data)
		if err == nil {
			if !utf8.Valid(data) || !json.Valid(data) || len(data) > 4096 {
				t.Fatalf("accepted %q, which is not one valid JSON document within the limit", data)
			}
			if creds.RefreshToken == "" {
				t.Fatalf("accepted %q without a refresh token: Validate was skipped", data)
			}
			return
		}
		var lerr *LoadError
		if !errors.As(err, &lerr) || !isOneOf(lerr.Kind, kinds) {
			t.Fatalf("error %v (%T) does not say what kind of damage it is", err, err)
		}
		if !reflect.DeepEqual(creds, sentinelCredentials()) {
			t.Fatalf("a failed load changed v to %+v", creds)
		}
		if utf8.Valid(data) && len(data) <= 4096 {
			if isOneOf(lerr.Kind, malformed) && json.Valid(data) && !bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
				t.Fatalf("%q reported as %v, but encoding/json finds it valid", data, lerr)
			}
			if isOneOf(lerr.Kind, wellFormed) && !json.Valid(data) {
				t.Fatalf("%q reported as %v, but encoding/json finds it malformed", data, lerr)
			}
		}
	})
}

func isOneOf(err error, kinds []error) bool {
	for _, k := range kinds {
		if err == k {
			return true
		}
	}
	return false
}
