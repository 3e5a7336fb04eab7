package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Role is what a principal may do. Viewer, operator and admin are ordered:
// each may do everything the one before it may (admin ⊇ operator ⊇
// viewer). Producer stands apart: it may send events and nothing else, so
// a leaked producer token cannot read payloads or pause a source. Admin
// may produce too: an admin can mint a producer token anyway, so refusing
// it intake would protect nothing and only make one-token setups (retryd
// dev, a bootstrap token) awkward.
type Role uint8

// Roles. The zero Role is no rule at all: Mount panics on an endpoint
// without one, so a route cannot be served by accident without a rule.
const (
	roleUnset Role = iota
	// RolePublic needs no credential: /healthz, /readyz and, unless
	// configured otherwise, /metrics.
	RolePublic
	RoleProducer
	RoleViewer
	RoleOperator
	RoleAdmin
)

var roleNames = map[Role]string{
	RolePublic: "public", RoleProducer: "producer", RoleViewer: "viewer",
	RoleOperator: "operator", RoleAdmin: "admin",
}

// Roles lists the roles a token may have, in order.
func Roles() []Role { return []Role{RoleProducer, RoleViewer, RoleOperator, RoleAdmin} }

func (r Role) String() string {
	if n, ok := roleNames[r]; ok {
		return n
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// MarshalText writes the role's name, so indexes and token lists say
// "operator" rather than a number.
func (r Role) MarshalText() ([]byte, error) {
	if _, ok := roleNames[r]; !ok {
		return nil, fmt.Errorf("marshal role: unknown role %d", uint8(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText reads a role's name.
func (r *Role) UnmarshalText(b []byte) error {
	p, err := ParseRole(string(b))
	if err != nil {
		return err
	}
	*r = p
	return nil
}

// ParseRole reads a role's name (producer, viewer, operator, admin or
// public).
func ParseRole(s string) (Role, error) {
	for r, n := range roleNames {
		if n == s {
			return r, nil
		}
	}
	return roleUnset, fmt.Errorf("unknown role %q: want producer, viewer, operator or admin", s)
}

// Allows reports whether a principal with role r may use a route that
// needs role need.
func (r Role) Allows(need Role) bool {
	switch need {
	case RolePublic:
		return true
	case RoleProducer:
		return r == RoleProducer || r == RoleAdmin
	case RoleViewer, RoleOperator, RoleAdmin:
		return r >= RoleViewer && r >= need
	}
	return false
}

// Principal is who made a request: a token's name and its role.
type Principal struct {
	Name string `json:"name"`
	Role Role   `json:"role"`
}

// LocalPrincipal is every request's principal when authentication is off
// (loopback only): the person at the machine, who may do everything.
var LocalPrincipal = Principal{Name: "local", Role: RoleAdmin}

// Authenticator turns a bearer token into its principal. It returns an
// error wrapping ErrBadCredential for a token that is unknown, expired or
// revoked; any other error means the check itself failed (e.g. Postgres
// is down).
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (Principal, error)
}

// ErrBadCredential is wrapped by an Authenticator's error when the token
// is not valid (401), as opposed to the check failing (503).
var ErrBadCredential = errors.New("invalid credential")

// ErrNoRole is wrapped by an Authenticator's error when the credential is
// valid but grants no retryd role (an OIDC token without the role claim):
// the caller is known, so asking for another credential is the wrong
// answer; every route but the public ones refuses it with 403.
var ErrNoRole = errors.New("no retryd role")

// Error codes of authentication and authorization.
const (
	CodeUnauthenticated = "unauthenticated"
	CodeForbidden       = "forbidden"
	CodeAuthUnavailable = "auth_unavailable"
	// CodeForeignHost: refused by a Guard with authentication off
	// because the request's Host is not loopback.
	CodeForeignHost = "foreign_host"
)

// SessionCookie is the cookie a browser may carry the token in instead of
// the Authorization header (the dashboard's sign-in sets it HttpOnly and
// SameSite=Strict). Cross-site requests are refused before it is read
// (NewServer), so it does not open the door to forged requests.
const SessionCookie = "retryd_session"

// authState is what Guard found out about a request; Require reads it.
type authState struct {
	principal Principal
	ok        bool
	err       error // why ok is false: no token, bad token, check failed
	// off: the principal is LocalPrincipal because authentication is
	// off, not because of a credential.
	off bool
}

type authKey struct{}

// errNoCredential is the reason of a request that carried no token.
var errNoCredential = errors.New("no credential: send Authorization: Bearer <token>")

// PrincipalFrom returns the authenticated principal of the request's
// context, if any.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	st, _ := ctx.Value(authKey{}).(*authState)
	if st == nil || !st.ok {
		return Principal{}, false
	}
	return st.principal, true
}

// AuthOff reports whether the request came through a Guard with
// authentication off: its caller is LocalPrincipal whoever it is. Routes
// whose effect would outlive that mode (creating a token) refuse it.
func AuthOff(ctx context.Context) bool {
	st, _ := ctx.Value(authKey{}).(*authState)
	return st != nil && st.off
}

// Actor is who audit records name for the request: the authenticated
// principal's name, never a name the client wrote in the body (a caller
// could claim to be anyone). Behind Require there is always one;
// "unauthenticated" marks a call that skipped it.
func Actor(r *http.Request) string {
	if p, ok := PrincipalFrom(r.Context()); ok {
		return p.Name
	}
	return "unauthenticated"
}

// WithPrincipal returns ctx carrying p as an authenticated principal, for
// code (and tests) that call handlers without a Guard in front.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, authKey{}, &authState{principal: p, ok: true})
}

// Guard authenticates every request before the mux sees it: it finds the
// bearer token (or the session cookie), asks Verifier who it belongs to
// and puts the answer in the request's context, where the rule of each
// route (Require, mounted by Mount) decides. With tokens on, Guard itself
// refuses nothing, so the public routes stay reachable with a bad token
// or with Postgres down; only /metrics, served by NewMux for every
// binary, gets its rule here. With authentication off it refuses every
// request whose Host is not loopback (see Verifier).
type Guard struct {
	// Verifier checks tokens; nil turns authentication off: every request
	// is LocalPrincipal. Only allowed on loopback listeners (see
	// internal/auth), and only for a loopback Host: a web page whose own
	// name its DNS rebinds to 127.0.0.1 reaches the listener with its
	// name in Host and, being same-origin with itself, passes the
	// cross-origin check; without this it would act as admin.
	Verifier Authenticator
	// MetricsRole is what GET /metrics needs; zero or RolePublic leaves it
	// open to scrapers without a token.
	MetricsRole Role
}

// Handler wraps h.
func (g Guard) Handler(h http.Handler) http.Handler {
	metrics := h
	if g.MetricsRole > RolePublic {
		metrics = Require(g.MetricsRole, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := &authState{}
		if g.Verifier == nil {
			if !IsLoopback(r.Host) {
				refuseForeignHost(w, r)
				return
			}
			st.principal, st.ok, st.off = LocalPrincipal, true, true
		} else if tok := bearer(r); tok == "" {
			st.err = errNoCredential
		} else if p, err := g.Verifier.Authenticate(r.Context(), tok); err != nil {
			st.err = err
		} else {
			st.principal, st.ok = p, true
		}
		r = r.WithContext(context.WithValue(r.Context(), authKey{}, st))
		switch {
		case r.URL.Path == "/metrics":
			metrics.ServeHTTP(w, r)
		case r.URL.Path == LoginPath && r.Method == http.MethodPost:
			g.login(w, r)
		case r.URL.Path == LogoutPath && r.Method == http.MethodPost:
			http.SetCookie(w, sessionCookie(r, "", -1))
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == WhoamiPath && r.Method == http.MethodGet:
			g.whoami(w, r, st)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// The dashboard's sign-in: POST LoginPath {"token": "rtd_…"} checks the
// token and sets it as the SessionCookie; POST LogoutPath clears it; GET
// WhoamiPath says who the request is. Guard serves them itself, as it
// holds the verifier, so every binary answers them alike.
const (
	LoginPath  = "/login"
	LogoutPath = "/logout"
	WhoamiPath = "/v1/whoami"
	// SessionMaxAge is how long a browser keeps the session cookie; the
	// token's own expiry and revocation still apply on every request.
	SessionMaxAge = 12 * 60 * 60
)

func sessionCookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{
		Name: SessionCookie, Value: value, Path: "/", MaxAge: maxAge,
		// Not readable by scripts, not sent on cross-site requests, and
		// only over TLS when the page came over TLS.
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	}
}

func (g Guard) login(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Token string `json:"token"`
	}
	if err := DecodeJSON(r, 4<<10, &req); err != nil {
		WriteError(w, err)
		return
	}
	p := LocalPrincipal
	if g.Verifier != nil {
		var err error
		p, err = g.Verifier.Authenticate(r.Context(), strings.TrimSpace(req.Token))
		if errors.Is(err, ErrBadCredential) {
			unauthenticated(w, err)
			return
		}
		if errors.Is(err, ErrNoRole) {
			WriteJSON(w, http.StatusForbidden, ErrorBody{Error: ErrorDetail{Code: CodeForbidden, Message: err.Error()}})
			return
		}
		if err != nil {
			WriteJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: ErrorDetail{
				Code: CodeAuthUnavailable, Message: "could not check the token; try again",
			}})
			return
		}
		http.SetCookie(w, sessionCookie(r, strings.TrimSpace(req.Token), SessionMaxAge))
	}
	w.Header().Set("Cache-Control", "no-store")
	WriteJSON(w, http.StatusOK, p)
}

// Whoami is the answer of GET WhoamiPath.
type Whoami struct {
	Principal
	// Session is true when the token came from the session cookie (the
	// dashboard's sign-in), so signing out means something.
	Session bool `json:"session"`
}

// whoami answers who the request's principal is, or 401 without one: the
// dashboard reads it to hide what the role may not do and to offer a
// sign-out. It needs no role, so any valid token may ask.
func (g Guard) whoami(w http.ResponseWriter, r *http.Request, st *authState) {
	if refuseUnauthenticated(w, st) {
		return
	}
	_, cookieErr := r.Cookie(SessionCookie)
	session := g.Verifier != nil && r.Header.Get("Authorization") == "" && cookieErr == nil
	w.Header().Set("Cache-Control", "no-store")
	WriteJSON(w, http.StatusOK, Whoami{Principal: st.principal, Session: session})
}

// refuseUnauthenticated answers 401 (no or a bad credential), 403 (a
// valid credential without a role) or 503 (the check failed) and returns
// true when the request has no principal.
func refuseUnauthenticated(w http.ResponseWriter, st *authState) bool {
	switch {
	case st == nil:
		unauthenticated(w, errNoCredential)
	case !st.ok && (errors.Is(st.err, errNoCredential) || errors.Is(st.err, ErrBadCredential)):
		unauthenticated(w, st.err)
	case !st.ok && errors.Is(st.err, ErrNoRole):
		WriteJSON(w, http.StatusForbidden, ErrorBody{Error: ErrorDetail{Code: CodeForbidden, Message: st.err.Error()}})
	case !st.ok:
		WriteJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: ErrorDetail{
			Code: CodeAuthUnavailable, Message: "could not check the token; try again",
		}})
	default:
		return false
	}
	return true
}

// bearer returns the request's token: the Authorization header's bearer
// token, else the session cookie.
func bearer(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, tok, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return ""
		}
		return strings.TrimSpace(tok)
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		return c.Value
	}
	return ""
}

// Require serves h only to a principal whose role allows need: 401 with
// WWW-Authenticate when the request has no valid credential (or no Guard
// ran), 403 when the role is not enough, 503 when the token could not be
// checked. It panics on the zero Role, so every route states its rule.
func Require(need Role, h http.Handler) http.Handler {
	if need == roleUnset {
		panic("serve: a route without a role: every endpoint must name the role it needs (serve.RolePublic for none)")
	}
	if need == RolePublic {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, _ := r.Context().Value(authKey{}).(*authState)
		switch {
		case refuseUnauthenticated(w, st):
		case !st.principal.Role.Allows(need):
			WriteJSON(w, http.StatusForbidden, ErrorBody{Error: ErrorDetail{
				Code: CodeForbidden,
				Message: fmt.Sprintf("%q has role %s; %s %s needs %s",
					st.principal.Name, st.principal.Role, r.Method, r.URL.Path, need),
			}})
		default:
			h.ServeHTTP(w, r)
		}
	})
}

func unauthenticated(w http.ResponseWriter, err error) {
	challenge := `Bearer realm="retryd"`
	if errors.Is(err, ErrBadCredential) {
		challenge += `, error="invalid_token"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	WriteJSON(w, http.StatusUnauthorized, ErrorBody{Error: ErrorDetail{Code: CodeUnauthenticated, Message: err.Error()}})
}

func refuseForeignHost(w http.ResponseWriter, r *http.Request) {
	here := "127.0.0.1:<port>"
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		here = a.String()
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	WriteJSON(w, http.StatusForbidden, ErrorBody{Error: ErrorDetail{
		Code: CodeForeignHost,
		Message: fmt.Sprintf("Host %q refused: authentication is off (RETRYD_AUTH=off), so only a loopback Host "+
			"(127.0.0.1, localhost, [::1]) is served, lest a web page that points its own name at this machine act as admin; "+
			"open %s://%s/ instead, or turn tokens on (RETRYD_AUTH=tokens, docs/security.md) to serve other names",
			r.Host, scheme, here),
	}})
}

// IsLoopback reports whether a listen address or a request's Host
// (host, host:port, [v6] or [v6]:port) names only the loopback
// interface: an IP of 127.0.0.0/8 or ::1 (IPv4-mapped too), or localhost
// in any case, with or without the trailing dot of its absolute form. An
// empty host (":8080") binds every interface, and an empty Host names
// nothing: both are not loopback. Any other name is refused, even one
// that resolves to 127.0.0.1 here: a DNS rebinding attacker's name does.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
