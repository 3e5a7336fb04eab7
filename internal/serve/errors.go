package serve

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/retryd/retryd/internal/streams"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
)

// ErrUnsupportedMediaType is wrapped when a body is not JSON by its
// Content-Type (415). Not found and conflict are the stores' errors
// (pgdb.ErrNotFound, pgdb.ErrConflict), which handlers wrap too: one
// value each, whichever part said it.
var ErrUnsupportedMediaType = errors.New("unsupported media type")

// Error codes of the error body.
const (
	CodeInvalidInput = "invalid_input"
	CodeTooLarge     = "too_large"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeMediaType    = "unsupported_media_type"
	CodeCrossOrigin  = "cross_origin"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
)

// RetryAfterFull is the Retry-After, in seconds, of a 503 for a full
// stream. A full stream stays full until max_age expires old messages or
// an operator raises its max_bytes, so asking again at once only adds
// load; half a minute lets the RetrydStreamNearLimit alert's operator act.
const RetryAfterFull = "30"

// FullMessage is the message of a 503 for a full stream.
const FullMessage = "a stream is full (its max_bytes, or the storage of JetStream): nothing was stored; send the same request again later"

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong; Field names the offending input field
// when known.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// WriteJSON writes v as JSON with the status code.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// WriteError writes err as an error body with the status ErrorStatus
// gives. The message of a 500 is hidden: it may carry internal details.
// A 503 says when to ask again (Retry-After).
func WriteError(w http.ResponseWriter, err error) {
	status, detail := Describe(err)
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", RetryAfterFull)
	}
	WriteJSON(w, status, ErrorBody{Error: detail})
}

// Reply answers a read: err as WriteError writes it, or else v with 200.
func Reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		WriteError(w, err)
		return
	}
	WriteJSON(w, http.StatusOK, v)
}

// ReplyPage answers a list read as Reply does; the store's error for a
// cursor it did not make (pgdb.ErrBadCursor, in err) is the client's: a
// 400 naming the cursor parameter.
func ReplyPage(w http.ResponseWriter, page any, err error) {
	if errors.Is(err, pgdb.ErrBadCursor) {
		err = &contract.FieldError{Field: "cursor", Reason: "is not a cursor returned by this API", Err: contract.ErrInvalid}
	}
	Reply(w, page, err)
}

// WriteErrorLog writes err as WriteError does, and logs it when it is
// the server's own failure (a 5xx): its body hides the error, so the log
// is where an operator finds it.
func WriteErrorLog(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	if status, _ := Describe(err); status >= 500 {
		log.Error().Err(err).Str("method", r.Method).Str("path", r.URL.Path).Msg("api request failed")
	}
	WriteError(w, err)
}

// Describe maps an error to its HTTP status and error detail, as WriteError
// writes them.
func Describe(err error) (int, ErrorDetail) {
	var maxBytes *http.MaxBytesError
	var field *contract.FieldError
	fieldName := ""
	if errors.As(err, &field) {
		fieldName = field.Field
	}
	switch {
	case errors.Is(err, contract.ErrTooLarge), errors.As(err, &maxBytes):
		if fieldName == "" {
			fieldName = "body"
		}
		return http.StatusRequestEntityTooLarge, ErrorDetail{Code: CodeTooLarge, Message: err.Error(), Field: fieldName}
	case errors.Is(err, contract.ErrInvalid):
		return http.StatusBadRequest, ErrorDetail{Code: CodeInvalidInput, Message: err.Error(), Field: fieldName}
	case errors.Is(err, pgdb.ErrNotFound):
		return http.StatusNotFound, ErrorDetail{Code: CodeNotFound, Message: err.Error()}
	case errors.Is(err, ErrUnsupportedMediaType):
		return http.StatusUnsupportedMediaType, ErrorDetail{Code: CodeMediaType, Message: err.Error(), Field: "Content-Type"}
	case errors.Is(err, pgdb.ErrConflict):
		return http.StatusConflict, ErrorDetail{Code: CodeConflict, Message: err.Error()}
	case streams.Full(err):
		// The request changed nothing: JetStream refused to store it.
		return http.StatusServiceUnavailable, ErrorDetail{Code: CodeUnavailable, Message: FullMessage}
	}
	return http.StatusInternalServerError, ErrorDetail{Code: CodeInternal, Message: "internal error"}
}
