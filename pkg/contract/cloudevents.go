package contract

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"mime"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// CloudEvents 1.0 beyond the attributes retryd uses itself: extension
// attributes, URI-reference sources, and the limits that keep them safe
// to store and to route on.
const (
	// MaxExtensions is how many extension attributes an event may carry.
	MaxExtensions = 32
	// MaxExtensionValueLen bounds a string extension's value, in bytes.
	MaxExtensionValueLen = 1024
	// MaxSourceLen bounds a source (a URI-reference), in bytes.
	MaxSourceLen = 256
)

// An extension's name is 1 to 20 lowercase letters and digits: the
// specification's rule (it asks for at most 20), which also keeps names
// safe as ce-<name> headers.
var extensionName = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

// coreMembers are the members of a structured event that are not
// extensions; optionalMembers may be null, which means left out.
var (
	coreMembers     = []string{"specversion", "id", "source", "type", "time", "subject", "datacontenttype", "dataschema", "data"}
	optionalMembers = []string{"time", "subject", "datacontenttype", "dataschema", "data"}
	// nonEmptyMembers must not be "" when present (the specification's
	// rule for every attribute).
	nonEmptyMembers = []string{"specversion", "id", "source", "type", "subject", "datacontenttype", "dataschema"}
)

// splitExtensions takes the extension attributes out of a structured event
// b (which passed checkShape) and returns the rest, re-encoded for the
// strict decoder, with them. b comes back as it is when it has no
// extension and no null member, so the strict decoder's errors point into
// what was sent.
func splitExtensions(b []byte) ([]byte, map[string]any, error) {
	var members map[string]json.RawMessage
	if json.Unmarshal(b, &members) != nil {
		return b, nil, nil // not an object: the strict decoder says why
	}
	var ext map[string]any
	changed := false
	for name, raw := range members {
		null := bytes.Equal(raw, []byte("null"))
		switch {
		case name == "data_base64":
			return nil, nil, fieldErr(name, "is not supported: retryd keeps an event's data as JSON; send it as data")
		case slices.Contains(coreMembers, name):
			if null && slices.Contains(optionalMembers, name) {
				delete(members, name)
				changed = true
			} else if bytes.Equal(raw, []byte(`""`)) && slices.Contains(nonEmptyMembers, name) {
				return nil, nil, fieldErr(name, "must not be empty: leave it out instead")
			}
			continue
		}
		delete(members, name)
		changed = true
		if null {
			continue // an extension set to null is left out
		}
		v, err := extensionValue(name, raw)
		if err != nil {
			return nil, nil, err
		}
		if ext == nil {
			ext = map[string]any{}
		}
		ext[name] = v
	}
	if len(ext) > MaxExtensions {
		return nil, nil, fieldErr("extensions", fmt.Sprintf("%d extension attributes, more than the limit of %d", len(ext), MaxExtensions))
	}
	if !changed {
		return b, nil, nil
	}
	core, err := json.Marshal(members)
	if err != nil {
		return nil, nil, fmt.Errorf("re-encode event: %w", err)
	}
	return core, ext, nil
}

// extensionValue decodes an extension attribute: a string (of at most
// MaxExtensionValueLen bytes; URIs, timestamps and binary travel as
// strings in JSON), a boolean or a 32-bit integer.
func extensionValue(name string, raw json.RawMessage) (any, error) {
	if !extensionName.MatchString(name) {
		return nil, fieldErr(name, "is not a CloudEvents attribute: an extension's name is 1 to 20 lowercase letters and digits")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fieldErr(name, "is not valid JSON")
	}
	switch x := v.(type) {
	case string:
		if len(x) > MaxExtensionValueLen {
			return nil, fieldErr(name, fmt.Sprintf("is %d bytes, more than the limit of %d", len(x), MaxExtensionValueLen))
		}
		if strings.ContainsRune(x, 0) {
			return nil, fieldErr(name, "contains a NUL character")
		}
		return x, nil
	case bool:
		return x, nil
	case json.Number:
		n, err := x.Int64()
		if err != nil || n < math.MinInt32 || n > math.MaxInt32 {
			return nil, fieldErr(name, fmt.Sprintf("%s is not a 32-bit integer (CloudEvents Integer)", x))
		}
		return n, nil
	}
	return nil, fieldErr(name, "must be a string, an integer or a boolean (an extension attribute)")
}

// appendExtensions adds ext to the JSON object b, names sorted, so an
// event encodes the same every time.
func appendExtensions(b []byte, ext map[string]any) ([]byte, error) {
	names := make([]string, 0, len(ext))
	for name := range ext {
		names = append(names, name)
	}
	slices.Sort(names)
	out := bytes.TrimSuffix(bytes.TrimSpace(b), []byte("}"))
	for _, name := range names {
		v, err := json.Marshal(ext[name])
		if err != nil {
			return nil, fmt.Errorf("encode extension %s: %w", name, err)
		}
		out = append(out, ',')
		out = append(out, fmt.Sprintf("%q:", name)...)
		out = append(out, v...)
	}
	return append(out, '}'), nil
}

// ValidateSource checks a producer event's source: a URI-reference
// (RFC 3986), such as "shop", "/billing/invoices" or
// "https://shop.example.com/orders", of at most MaxSourceLen bytes.
func ValidateSource(field, source string) error {
	switch {
	case source == "":
		return fieldErr(field, "is required")
	case len(source) > MaxSourceLen:
		return fieldErr(field, fmt.Sprintf("is %d bytes, more than the limit of %d", len(source), MaxSourceLen))
	}
	for i := 0; i < len(source); i++ {
		if !uriChar(source[i]) {
			return fieldErr(field, fmt.Sprintf("%q is not a URI-reference: byte %d (%q) must be percent-encoded", source, i, source[i]))
		}
	}
	if _, err := url.Parse(source); err != nil {
		return fieldErr(field, fmt.Sprintf("%q is not a URI-reference: %v", source, err))
	}
	return nil
}

// uriChar reports whether c may stand in a URI-reference as it is: the
// unreserved and reserved characters of RFC 3986, and '%' of an escape.
func uriChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~:/?#[]@!$&'()*+,;=%", c) >= 0
}

// SourceKey is the subject token that stands for a source in
// ingest.<source> and events.<source>.<type>, and by which the source
// gate, its API and triggers know it. A source that is a token (what
// retryd's sources have always been) is its own key. Any other
// URI-reference becomes its lowercase letters and digits, with a hyphen
// for each run of anything else, after its scheme: at most 48 characters,
// then "-" and 8 hex digits of its SHA-256, so that sources that differ
// only in punctuation keep distinct keys:
// "https://shop.example.com/orders" is "shop-example-com-orders-" and 8
// hex digits.
func SourceKey(source string) string {
	if ValidateToken("source", source) == nil {
		return source
	}
	rest := source
	if i := strings.Index(rest, "://"); i > 0 {
		rest = rest[i+3:]
	}
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(rest) {
		if ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(c)
			if b.Len() >= 48 {
				break
			}
			continue
		}
		dash = true
	}
	sum := sha256.Sum256([]byte(source))
	hash := hex.EncodeToString(sum[:4])
	if b.Len() == 0 {
		return "src-" + hash
	}
	return b.String() + "-" + hash
}

// validateMediaType checks a datacontenttype: a media type of RFC 2046
// (type/subtype, with parameters).
func validateMediaType(field, ct string) error {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || !strings.Contains(mt, "/") {
		return fieldErr(field, fmt.Sprintf("%q is not a media type such as application/json", ct))
	}
	return nil
}

// validateDataSchema checks a dataschema: an absolute URI.
func validateDataSchema(field, s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || ValidateSource(field, s) != nil {
		return fieldErr(field, fmt.Sprintf("%q is not an absolute URI", s))
	}
	return nil
}
