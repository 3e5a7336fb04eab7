// Package auth holds retryd's API tokens: the Postgres store (only their
// SHA-256 is kept), the verifier every service puts behind serve.Guard, the
// admin routes that create, list and revoke tokens, the bootstrap admin
// token and the RETRYD_AUTH settings. See docs/security.md.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/retryd/retryd/internal/audit"
	"github.com/retryd/retryd/internal/pgrows"
	"github.com/retryd/retryd/internal/serve"
	"github.com/retryd/retryd/pkg/contract"
	"github.com/retryd/retryd/stores/pgdb"
)

// Prefix starts every token, so a token pasted in a chat or a log is
// recognisable (and secret scanners can match it).
const Prefix = "rtd_"

// secretBytes is the randomness of a token: 256 bits, so a plain SHA-256
// is enough to store it (no salt or slow hash is needed against a guess).
const secretBytes = 32

// minTokenLen is the shortest token accepted, a bootstrap token included:
// the prefix and 32 characters.
const minTokenLen = len(Prefix) + 32

// BootstrapName is the name of the admin token that RETRYD_ADMIN_TOKEN
// ensures.
const BootstrapName = "bootstrap"

// maxNameLen bounds a token's name: the name is the `by` of the
// lifecycle facts an action publishes, which allow contract.MaxTokenLen
// (a longer name would make every cancel or retry of its holder fail).
// The migration's check (100) is looser.
const maxNameLen = contract.MaxTokenLen

// Token is a token's record, without its secret.
type Token struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	Role       serve.Role `json:"role"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

// Store keeps tokens in the api_tokens table.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// NewSecret returns a fresh token: the prefix and 256 random bits.
func NewSecret() (string, error) {
	b := make([]byte, secretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random: %w", err)
	}
	return Prefix + base64.RawURLEncoding.EncodeToString(b), nil
}

// hash is what the table stores of a token.
func hash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// wellFormed reports whether s can be a token at all, so that garbage is
// refused without a query.
func wellFormed(s string) bool {
	return strings.HasPrefix(s, Prefix) && len(s) >= minTokenLen && len(s) <= 512
}

func invalid(field, reason string) error {
	return &contract.FieldError{Field: field, Reason: reason, Err: contract.ErrInvalid}
}

func validName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return invalid("name", fmt.Sprintf("must be 1 to %d characters", maxNameLen))
	}
	if strings.HasPrefix(name, OIDCPrefix) {
		// Audit would not tell the token from the OIDC user.
		return invalid("name", fmt.Sprintf("must not start with %q (OIDC principals' names do)", OIDCPrefix))
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return invalid("name", "must be printable text")
		}
	}
	return nil
}

func validRole(r serve.Role) error {
	for _, ok := range serve.Roles() {
		if r == ok {
			return nil
		}
	}
	return invalid("role", "must be producer, viewer, operator or admin")
}

const tokenColumns = `id, name, role, created_at, expires_at, last_used_at, revoked_at`

func scanToken(row pgx.Row) (Token, error) {
	var t Token
	var role string
	if err := row.Scan(&t.ID, &t.Name, &role, &t.CreatedAt, &t.ExpiresAt, &t.LastUsedAt, &t.RevokedAt); err != nil {
		return Token{}, err
	}
	r, err := serve.ParseRole(role)
	if err != nil {
		return Token{}, fmt.Errorf("read token %s: %w", t.ID, err)
	}
	t.Role = r
	return t, nil
}

// Create stores a new token named name with role, valid until expiresAt
// (nil: until revoked), and returns its record and its secret, which is
// not kept and cannot be shown again. A live token with the same name is
// a conflict.
func (s *Store) Create(ctx context.Context, name string, role serve.Role, expiresAt *time.Time) (Token, string, error) {
	if err := validName(name); err != nil {
		return Token{}, "", err
	}
	if err := validRole(role); err != nil {
		return Token{}, "", err
	}
	if expiresAt != nil && !expiresAt.After(time.Now()) {
		return Token{}, "", invalid("expires_at", "must be in the future")
	}
	secret, err := NewSecret()
	if err != nil {
		return Token{}, "", err
	}
	var t Token
	// The audit entry (for a request: audit.Record names its principal)
	// is written with the token, or not at all.
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		t, err = scanToken(tx.QueryRow(ctx, `
			INSERT INTO api_tokens (id, name, role, hash, expires_at)
			VALUES ($1, $2, $3, $4, $5)
			RETURNING `+tokenColumns, contract.NewID(), name, role.String(), hash(secret), expiresAt))
		if err != nil {
			return err
		}
		d := audit.Detail{"name": t.Name, "role": t.Role.String()}
		if t.ExpiresAt != nil {
			d["expires_at"] = t.ExpiresAt.UTC().Format(time.RFC3339)
		}
		return audit.Record(ctx, tx, audit.TokenCreate, "token/"+t.ID, d)
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return Token{}, "", fmt.Errorf("create token: a live token is named %q already: %w", name, pgdb.ErrConflict)
	}
	if err != nil {
		return Token{}, "", fmt.Errorf("create token: %w", err)
	}
	return t, secret, nil
}

// List returns every token, revoked ones included, newest first.
func (s *Store) List(ctx context.Context) ([]Token, error) {
	return pgrows.All(ctx, s.pool, "list tokens", scanToken, `SELECT `+tokenColumns+` FROM api_tokens ORDER BY created_at DESC, id DESC`)
}

// Revoke revokes the token id and returns its record; revoking a revoked
// token changes nothing. The verifiers of running services stop
// accepting it within their cache TTL.
func (s *Store) Revoke(ctx context.Context, id string) (Token, error) {
	var t Token
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		t, err = scanToken(tx.QueryRow(ctx, `
			UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())
			WHERE id = $1
			RETURNING `+tokenColumns, id))
		if err != nil {
			return err
		}
		return audit.Record(ctx, tx, audit.TokenRevoke, "token/"+t.ID, audit.Detail{"name": t.Name})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Token{}, fmt.Errorf("token %q: %w", id, pgdb.ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("revoke token: %w", err)
	}
	return t, nil
}

// lookup returns the record of the token whose hash is h, or
// pgx.ErrNoRows.
func (s *Store) lookup(ctx context.Context, h []byte) (Token, error) {
	t, err := scanToken(s.pool.QueryRow(ctx, `SELECT `+tokenColumns+` FROM api_tokens WHERE hash = $1`, h))
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Token{}, fmt.Errorf("look up token: %w", err)
	}
	return t, err
}

// touch records that the token id was used at.
func (s *Store) touch(ctx context.Context, id string, at time.Time) error {
	if _, err := s.pool.Exec(ctx, `UPDATE api_tokens SET last_used_at = $2 WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)`, id, at); err != nil {
		return fmt.Errorf("touch token: %w", err)
	}
	return nil
}

// EnsureBootstrap makes secret the live admin token named "bootstrap".
// Every service may call it at start, at once: it is idempotent, and a
// bootstrap token with another secret (the secret was rotated) is
// revoked first.
func (s *Store) EnsureBootstrap(ctx context.Context, secret string) error {
	if !wellFormed(secret) {
		return fmt.Errorf("bootstrap token: must start with %q and be at least %d characters (e.g. rtd_ and `openssl rand -hex 32`)", Prefix, minTokenLen)
	}
	h := hash(secret)
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ensure bootstrap token: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `
		UPDATE api_tokens SET revoked_at = now()
		WHERE name = $1 AND revoked_at IS NULL AND hash <> $2`, BootstrapName, h); err != nil {
		return fmt.Errorf("revoke old bootstrap token: %w", err)
	}
	// A revoked row with this very hash stays revoked: a revoked secret is
	// not brought back to life by a restart, the operator must set a new one.
	if _, err := tx.Exec(ctx, `
		INSERT INTO api_tokens (id, name, role, hash) VALUES ($1, $2, 'admin', $3)
		ON CONFLICT DO NOTHING`, contract.NewID(), BootstrapName, h); err != nil {
		return fmt.Errorf("insert bootstrap token: %w", err)
	}
	var revoked bool
	if err := tx.QueryRow(ctx, `SELECT revoked_at IS NOT NULL FROM api_tokens WHERE hash = $1`, h).Scan(&revoked); err != nil {
		return fmt.Errorf("read bootstrap token: %w", err)
	}
	if revoked {
		return errors.New("bootstrap token: this secret was revoked; set a new RETRYD_ADMIN_TOKEN")
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ensure bootstrap token: %w", err)
	}
	return nil
}
