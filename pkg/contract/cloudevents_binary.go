package contract

import (
	"fmt"
	"mime"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// In binary mode (the HTTP and NATS protocol bindings of CloudEvents) an
// event's attributes travel as headers named ce-<attribute> and its data
// is the body, described by the Content-Type header.
const (
	// HeaderCEPrefix starts the header of each attribute in binary mode.
	HeaderCEPrefix = "ce-"
	// ContentTypeCloudEvents marks a structured-mode body (one event).
	ContentTypeCloudEvents = "application/cloudevents+json"
)

// IsBinaryEvent reports whether headers carry an event in binary mode: a
// ce-specversion header, and a content type other than structured mode's
// (a structured body wins: the bindings say so). Header names are matched
// without regard to case, as HTTP has them and NATS may not.
func IsBinaryEvent(headers map[string][]string) bool {
	if headerValue(headers, HeaderCEPrefix+"specversion") == "" {
		return false
	}
	mt, _, _ := mime.ParseMediaType(headerValue(headers, "content-type"))
	return mt != ContentTypeCloudEvents
}

// DecodeBinaryEvent builds a producer event from a message in binary mode:
// ce-id, ce-source, ce-type, ce-specversion, ce-time, ce-subject and
// ce-dataschema are the attributes of those names, any other ce-<name>
// header a string extension attribute, Content-Type the datacontenttype
// and the body the data. Values are percent-decoded (the HTTP binding
// escapes what a header cannot hold). retryd keeps data as JSON, so the
// body must be JSON when there is one: its content type is
// application/json, one ending in +json, or none. The event is validated
// as DecodeProducerEvent validates one.
func DecodeBinaryEvent(headers map[string][]string, body []byte) (ProducerEvent, error) {
	var ev ProducerEvent
	for name, values := range headers {
		lower := strings.ToLower(name)
		attr, ok := strings.CutPrefix(lower, HeaderCEPrefix)
		if !ok || len(values) == 0 {
			continue
		}
		field := HeaderCEPrefix + attr
		if len(values) > 1 {
			return ProducerEvent{}, fieldErr(field, "is given more than once")
		}
		v, err := url.PathUnescape(values[0])
		if err != nil || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return ProducerEvent{}, fieldErr(field, "is not a valid percent-encoded UTF-8 value")
		}
		if err := ev.setBinaryAttribute(field, attr, v); err != nil {
			return ProducerEvent{}, err
		}
	}
	if ev.SpecVersion != SpecVersion {
		return ProducerEvent{}, fieldErr(HeaderCEPrefix+"specversion", fmt.Sprintf("must be %q, got %q", SpecVersion, ev.SpecVersion))
	}
	if len(ev.Extensions) > MaxExtensions {
		return ProducerEvent{}, fieldErr("extensions", fmt.Sprintf("%d extension attributes, more than the limit of %d", len(ev.Extensions), MaxExtensions))
	}
	ct := headerValue(headers, "content-type")
	if ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != ContentTypeJSON && !strings.HasSuffix(mt, "+json")) {
			return ProducerEvent{}, fieldErr("datacontenttype", fmt.Sprintf("%q is not JSON: retryd keeps an event's data as JSON (application/json or a +json type)", ct))
		}
		ev.DataContentType = ct
	}
	if len(body) > 0 {
		if err := checkShape("data", body, MaxDataBytes); err != nil {
			return ProducerEvent{}, err
		}
		ev.Data = append([]byte(nil), body...)
	}
	return ev, ev.Validate()
}

// setBinaryAttribute sets attribute attr (a ce- header's name without the
// prefix) to v.
func (ev *ProducerEvent) setBinaryAttribute(field, attr, v string) error {
	if v == "" {
		return fieldErr(field, "must not be empty: leave the header out instead")
	}
	switch attr {
	case "specversion":
		ev.SpecVersion = v
	case "id":
		ev.ID = v
	case "source":
		ev.Source = v
	case "type":
		ev.Type = v
	case "subject":
		ev.Subject = v
	case "dataschema":
		ev.DataSchema = v
	case "datacontenttype", "data", "data_base64":
		return fieldErr(field, "is not an attribute in binary mode: the Content-Type header and the body carry the data")
	case "time":
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return fieldErr(field, fmt.Sprintf("%q is not an RFC 3339 time", v))
		}
		ev.Time = &t
	default:
		if !extensionName.MatchString(attr) {
			return fieldErr(field, "is not a CloudEvents attribute: an extension's name is 1 to 20 lowercase letters and digits")
		}
		if len(v) > MaxExtensionValueLen {
			return fieldErr(field, fmt.Sprintf("is %d bytes, more than the limit of %d", len(v), MaxExtensionValueLen))
		}
		if ev.Extensions == nil {
			ev.Extensions = map[string]any{}
		}
		ev.Extensions[attr] = v
	}
	return nil
}

// DecodeProducerMsg decodes a producer event from a message's headers and
// body, in binary mode when the headers say so (IsBinaryEvent), in
// structured mode otherwise.
func DecodeProducerMsg(headers map[string][]string, body []byte) (ProducerEvent, error) {
	if IsBinaryEvent(headers) {
		return DecodeBinaryEvent(headers, body)
	}
	return DecodeProducerEvent(body)
}

// headerValue is the first value of header name, matched without regard
// to case.
func headerValue(headers map[string][]string, name string) string {
	for k, v := range headers {
		if len(v) > 0 && strings.EqualFold(k, name) {
			return v[0]
		}
	}
	return ""
}
