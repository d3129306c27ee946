package atomicfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultMaxSize is the largest file LoadJSON reads unless WithMaxSize says
// otherwise. Credentials are a few kilobytes; anything near this is not one.
const DefaultMaxSize = 1 << 20

// The kinds of damage LoadJSON reports; check with errors.Is. A missing file
// is none of these: it matches fs.ErrNotExist, and only the caller can decide
// what a missing file means.
var (
	ErrNotRegular   = errors.New("not a regular file")
	ErrTooLarge     = errors.New("file too large")
	ErrEmpty        = errors.New("file empty")
	ErrInvalidUTF8  = errors.New("invalid UTF-8")
	ErrTruncated    = errors.New("JSON truncated")
	ErrSyntax       = errors.New("JSON syntax error")
	ErrWrongType    = errors.New("JSON value of the wrong type")
	ErrUnknownField = errors.New("unknown JSON field")
	ErrTrailingData = errors.New("data after the JSON value")
	ErrInvalid      = errors.New("failed validation")
)

// Validator is implemented by values that can tell whether what LoadJSON
// decoded is usable, for example credentials that lack their refresh token.
type Validator interface {
	Validate() error
}

// LoadOption configures LoadJSON.
type LoadOption func(*loadConfig)

// WithMaxSize sets the largest file LoadJSON accepts, in bytes.
func WithMaxSize(n int64) LoadOption {
	return func(c *loadConfig) { c.maxSize = n }
}

// WithDisallowUnknownFields makes an object key that matches no field of the
// target an error, as json.Decoder.DisallowUnknownFields does.
func WithDisallowUnknownFields() LoadOption {
	return func(c *loadConfig) { c.disallowUnknownFields = true }
}

type loadConfig struct {
	maxSize               int64
	disallowUnknownFields bool
}

// LoadJSON reads the JSON file at path into v, which must be a non-nil
// pointer, and then calls v's Validate method if it has one.
//
// It is strict because a damaged credentials file must never look like "no
// credentials": a file that is empty, only whitespace or JSON null, larger
// than the size limit, not UTF-8, truncated, not JSON, of the wrong shape,
// followed by anything but whitespace, or that fails Validate is an error, a
// *LoadError that says what is wrong and where. An object that parses but
// lacks what the caller needs, such as {}, is caught only by Validate, so
// credential types should have one. v is set only when LoadJSON returns nil;
// it is replaced, not merged into. The file is opened read-only and never
// changed.
func LoadJSON(path string, v any, opts ...LoadOption) error {
	c := loadConfig{maxSize: DefaultMaxSize}
	for _, opt := range opts {
		opt(&c)
	}
	target := reflect.ValueOf(v)
	if target.Kind() != reflect.Pointer || target.IsNil() {
		return fmt.Errorf("load %s: LoadJSON needs a non-nil pointer, got %T", path, v)
	}
	data, err := c.read(path)
	if err != nil {
		return err
	}
	fresh := reflect.New(target.Type().Elem())
	if err := c.decode(path, data, fresh.Interface()); err != nil {
		return err
	}
	if validator, ok := fresh.Interface().(Validator); ok {
		if err := validator.Validate(); err != nil {
			return &LoadError{Path: path, Kind: ErrInvalid, Offset: -1, Err: err,
				detail: "failed validation: " + err.Error()}
		}
	}
	target.Elem().Set(fresh.Elem())
	return nil
}

func (c *loadConfig) read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		detail := "cannot open: " + err.Error()
		if errors.Is(err, fs.ErrNotExist) {
			detail = "does not exist"
		}
		return nil, &LoadError{Path: path, Offset: -1, Err: err, detail: detail}
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, &LoadError{Path: path, Offset: -1, Err: err, detail: "cannot stat: " + err.Error()}
	}
	if !info.Mode().IsRegular() {
		return nil, &LoadError{Path: path, Kind: ErrNotRegular, Offset: -1,
			detail: fmt.Sprintf("is not a regular file (%v)", info.Mode().Type())}
	}
	// Read one byte past the limit so a file that grew since Stat is caught too.
	data, err := io.ReadAll(io.LimitReader(f, c.maxSize+1))
	if err != nil {
		return nil, &LoadError{Path: path, Offset: -1, Err: err, detail: "cannot read: " + err.Error()}
	}
	if int64(len(data)) > c.maxSize {
		return nil, &LoadError{Path: path, Kind: ErrTooLarge, Offset: -1,
			detail: fmt.Sprintf("is %d bytes, more than the %d-byte limit: refusing to load it", max(info.Size(), int64(len(data))), c.maxSize)}
	}
	if len(data) == 0 {
		return nil, &LoadError{Path: path, Kind: ErrEmpty, Offset: -1,
			detail: "is empty (0 bytes): refusing to treat it as no credentials"}
	}
	if len(bytes.TrimLeft(data, " \t\r\n")) == 0 {
		return nil, &LoadError{Path: path, Kind: ErrEmpty, Offset: -1,
			detail: fmt.Sprintf("holds only whitespace (%d bytes): refusing to treat it as no credentials", len(data))}
	}
	if offset := invalidUTF8Offset(data); offset >= 0 {
		if !utf8.FullRune(data[offset:]) {
			end := int64(len(data))
			return nil, &LoadError{Path: path, Kind: ErrTruncated, Offset: end,
				detail: "is truncated: it ends in the middle of a UTF-8 character at " + position(data, end)}
		}
		return nil, &LoadError{Path: path, Kind: ErrInvalidUTF8, Offset: offset,
			detail: "is not valid UTF-8 at " + position(data, offset)}
	}
	return data, nil
}

// invalidUTF8Offset returns the offset of the first byte that is not part of
// valid UTF-8, or -1. encoding/json would silently turn such bytes into U+FFFD.
func invalidUTF8Offset(data []byte) int64 {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size == 1 {
			return int64(i)
		}
		i += size
	}
	return -1
}

// decode checks that data is exactly one JSON value before decoding it into
// v, so that a file that is not JSON at all is reported as such rather than as
// a value of the wrong type.
func (c *loadConfig) decode(path string, data []byte, v any) error {
	var value json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&value); err != nil {
		return decodeError(path, data, 0, err)
	}
	end := dec.InputOffset()
	if trimmed := bytes.TrimLeft(data[end:], " \t\r\n"); len(trimmed) > 0 {
		offset := int64(len(data) - len(trimmed))
		return &LoadError{Path: path, Kind: ErrTrailingData, Offset: offset,
			detail: "has data after the JSON value at " + position(data, offset)}
	}
	if bytes.Equal(value, []byte("null")) {
		return &LoadError{Path: path, Kind: ErrEmpty, Offset: -1,
			detail: "holds only JSON null: refusing to treat it as no credentials"}
	}
	dec = json.NewDecoder(bytes.NewReader(value))
	if c.disallowUnknownFields {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return decodeError(path, data, end-int64(len(value)), err)
	}
	return nil
}

// decodeError classifies an encoding/json error; base is where the decoded
// bytes start in data.
func decodeError(path string, data []byte, base int64, err error) error {
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		offset := int64(len(data))
		return &LoadError{Path: path, Kind: ErrTruncated, Offset: offset, Err: err,
			detail: "is truncated: the JSON value ends unexpectedly at " + position(data, offset)}
	case errors.As(err, &syntaxErr):
		// Offset counts the bytes read, the offending one included.
		offset := base + max(syntaxErr.Offset-1, 0)
		return &LoadError{Path: path, Kind: ErrSyntax, Offset: offset, Err: err,
			detail: "is not valid JSON at " + position(data, offset) + ": " + syntaxErr.Error()}
	case errors.As(err, &typeErr):
		offset := base + typeErr.Offset
		field := typeErr.Field
		where := "at the top level"
		if field != "" {
			where = "in field " + strconv.Quote(field)
		}
		return &LoadError{Path: path, Kind: ErrWrongType, Offset: offset, Field: field, Err: err,
			detail: fmt.Sprintf("has a JSON %s %s where %v belongs, near %s", typeErr.Value, where, typeErr.Type, position(data, offset))}
	}
	// encoding/json reports unknown fields only as text.
	if quoted, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		field, uerr := strconv.Unquote(quoted)
		if uerr == nil {
			return &LoadError{Path: path, Kind: ErrUnknownField, Offset: -1, Field: field, Err: err,
				detail: fmt.Sprintf("has the unknown field %q", field)}
		}
	}
	// What remains comes from a field's own UnmarshalJSON or UnmarshalText,
	// for example a time that does not parse.
	return &LoadError{Path: path, Kind: ErrWrongType, Offset: -1, Err: err,
		detail: "has a value that does not fit its field: " + err.Error()}
}

// position describes a byte offset as an editor shows it.
func position(data []byte, offset int64) string {
	before := data[:min(offset, int64(len(data)))]
	line := bytes.Count(before, []byte("\n")) + 1
	column := len(before) - bytes.LastIndexByte(before, '\n')
	return fmt.Sprintf("byte offset %d (line %d, column %d)", offset, line, column)
}

// LoadError is the error LoadJSON returns. errors.Is matches it against its
// Kind, one of the Err* values above, and against its cause, so a missing file
// matches fs.ErrNotExist and a syntax error can be taken apart with errors.As
// into a *json.SyntaxError.
type LoadError struct {
	Path   string // the file being loaded
	Kind   error  // one of the Err* values; nil when the file could not be opened or read
	Offset int64  // byte offset of the problem in the file, -1 when there is none
	Field  string // the JSON field at fault, dotted from the top, when known
	Err    error  // the underlying cause, nil when Kind says it all
	detail string
}

func (e *LoadError) Error() string { return "load " + e.Path + ": " + e.detail }

func (e *LoadError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.Kind, e.Err} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
