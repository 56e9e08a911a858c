package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SchemaVersion is the version of the schema this binary creates and
// uses. ratelimitd_schema holds the database's; New migrates an older one
// step by step and refuses a newer one.
const SchemaVersion = 1

//go:embed schema_v1.sql
var schemaV1 string

// migrations[v-1] brings a database from version v-1 to v. Every
// statement of every migration is idempotent (IF NOT EXISTS, OR REPLACE),
// so that running them all again recreates whatever is missing and keeps
// what is there.
var migrations = []string{schemaV1}

// schemaObject is a table, index or function the migrations create.
type schemaObject struct {
	name     string
	function bool
}

// schemaObjects are the objects the migrations create, every one of
// which a decision needs (a function calls the others).
var schemaObjects = objectsOf(migrations)

var createRE = regexp.MustCompile(`(?m)^CREATE (?:OR REPLACE )?(TABLE|INDEX|FUNCTION) (?:IF NOT EXISTS )?(\w+)`)

func objectsOf(scripts []string) []schemaObject {
	var objs []schemaObject
	for _, sql := range scripts {
		for _, m := range createRE.FindAllStringSubmatch(sql, -1) {
			objs = append(objs, schemaObject{name: m[2], function: m[1] == "FUNCTION"})
		}
	}
	return objs
}

// missingSQL is an expression: the names of the schemaObjects that do
// not exist (text[]); the names are the migrations' own, word characters
// only.
var missingSQL = func() string {
	var b strings.Builder
	b.WriteString("array_remove(ARRAY[")
	for i, o := range schemaObjects {
		if i > 0 {
			b.WriteString(", ")
		}
		fn := "to_regclass"
		if o.function {
			fn = "to_regproc"
		}
		fmt.Fprintf(&b, "CASE WHEN %s('%s') IS NULL THEN '%s' END", fn, o.name, o.name)
	}
	b.WriteString("]::text[], NULL)")
	return b.String()
}()

// migrateLock is the transaction-level advisory lock key that serializes
// the migrations of replicas starting together ("rlimitd!" as an int64).
const migrateLock = 0x726c696d69746421

// ErrSchemaNewer is wrapped by New's error when the database's schema is
// newer than SchemaVersion: a newer ratelimitd migrated it, and this
// binary would not know its rows.
var ErrSchemaNewer = errors.New("schema newer than this binary")

// migrate creates or migrates the schema in one transaction, under the
// advisory lock. At the current version it checks that every object of
// the schema exists, and recreates the missing ones (a table-only restore
// lacks the functions, a dropped table loses its counts), logging their
// names.
func (s *Store) migrate(ctx context.Context) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Another replica may be migrating: wait for it (New's ctx
		// bounds the wait), not only lock_timeout.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = 0"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrateLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS ratelimitd_schema (
	id int PRIMARY KEY CHECK (id = 1),
	version int NOT NULL
)`); err != nil {
			return err
		}
		var v int
		err := tx.QueryRow(ctx, "SELECT version FROM ratelimitd_schema WHERE id = 1").Scan(&v)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if v > SchemaVersion {
			return newError(CauseSchema, false, fmt.Errorf("%w: the database is at version %d, this binary knows up to %d; run a newer ratelimitd", ErrSchemaNewer, v, SchemaVersion))
		}
		for next := v + 1; next <= SchemaVersion; next++ {
			if _, err := tx.Exec(ctx, migrations[next-1]); err != nil {
				return fmt.Errorf("schema version %d: %w", next, err)
			}
			s.log.Info("durable store: schema migrated", "version", next)
		}
		if v == SchemaVersion {
			var missing []string
			if err := tx.QueryRow(ctx, "SELECT "+missingSQL).Scan(&missing); err != nil {
				return err
			}
			if len(missing) == 0 {
				return nil
			}
			for i, m := range migrations {
				if _, err := tx.Exec(ctx, m); err != nil {
					return fmt.Errorf("schema version %d: %w", i+1, err)
				}
			}
			s.log.Warn("durable store: schema objects were missing; recreated them (a recreated table starts empty)", "version", v, "recreated", strings.Join(missing, ","))
			return nil
		}
		_, err = tx.Exec(ctx, `INSERT INTO ratelimitd_schema (id, version) VALUES (1, $1)
ON CONFLICT (id) DO UPDATE SET version = excluded.version`, SchemaVersion)
		return err
	})
	return classify(err, s.secrets)
}
