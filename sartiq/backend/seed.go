package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"hermeshost/sartiq"
)

// DemoCategories are the guidelines categories the demo manifests ask for: what "all
// categories" means to a guidelines_extraction worker.
var DemoCategories = []string{"tone-of-voice", "logo-usage", "color-palette", "typography", "imagery"}

// DemoOrganizations are the organizations --seed-demo creates.
var DemoOrganizations = []string{"acme", "globex"}

// NewJob is a job to queue.
type NewJob struct {
	Type           string
	OrganizationID string
	Instructions   string
	Categories     []string
	Sources        []sartiq.ManifestSource
	// SeedKey, when set, makes creation idempotent: a second job with the same key is not made.
	SeedKey string
}

// EnsureOrganization creates an organization if it does not exist.
func EnsureOrganization(ctx context.Context, db *pgxpool.Pool, id, name string, now time.Time) error {
	if !orgPattern.MatchString(id) {
		return fmt.Errorf("ensure organization %q: not a valid organization id", id)
	}
	if _, err := db.Exec(ctx, `INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING`,
		id, name, now); err != nil {
		return fmt.Errorf("ensure organization %s: %w", id, err)
	}
	return nil
}

// CreateJob queues a job and returns its id (the existing job's id for a SeedKey seen
// before). Its manifest is written with the job's own id and organization.
func CreateJob(ctx context.Context, db *pgxpool.Pool, j NewJob, now time.Time) (string, error) {
	if !jobTypes[j.Type] {
		return "", fmt.Errorf("create job: unknown type %q", j.Type)
	}
	var seedKey *string
	if j.SeedKey != "" {
		seedKey = &j.SeedKey
	}
	sources := j.Sources
	if sources == nil {
		sources = []sartiq.ManifestSource{}
	}
	var id string
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO agent_jobs (type, organization_id, manifest, seed_key, created_at)
			VALUES ($1, $2, '{}', $3, $4)
			ON CONFLICT (seed_key) DO NOTHING
			RETURNING id::text`, j.Type, j.OrganizationID, seedKey, now).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return tx.QueryRow(ctx, `SELECT id::text FROM agent_jobs WHERE seed_key = $1`, seedKey).Scan(&id)
		}
		if err != nil {
			return err
		}
		manifest, err := json.Marshal(sartiq.Manifest{
			JobID: id, Type: j.Type, OrganizationID: j.OrganizationID,
			Instructions: j.Instructions, Categories: j.Categories, Sources: sources,
		})
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE agent_jobs SET manifest = $2 WHERE id = $1`, id, string(manifest))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("create %s job for %s: %w", j.Type, j.OrganizationID, err)
	}
	return id, nil
}

// SeedDemo creates the demo organizations, their products and one queued job of each type
// per organization. It is idempotent: a second run creates nothing new.
func SeedDemo(ctx context.Context, db *pgxpool.Pool, now time.Time) error {
	for _, org := range DemoOrganizations {
		if err := EnsureOrganization(ctx, db, org, demoName(org), now); err != nil {
			return fmt.Errorf("seed demo: %w", err)
		}
		for i, p := range demoProducts {
			if _, err := db.Exec(ctx, `
				INSERT INTO products (organization_id, sku, name, description, attributes, created_at)
				VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (organization_id, sku) DO NOTHING`,
				org, fmt.Sprintf("%s-%03d", org, i+1), p.name, p.description, p.attributes, now); err != nil {
				return fmt.Errorf("seed demo products of %s: %w", org, err)
			}
		}
		jobs := demoJobs(org, "")
		for _, j := range jobs {
			if _, err := CreateJob(ctx, db, j, now); err != nil {
				return fmt.Errorf("seed demo: %w", err)
			}
		}
	}
	return nil
}

// demoJobs is org's demo jobs, one of each type; batch ("" for the first) tells their seed
// keys apart from earlier batches'.
func demoJobs(org, batch string) []NewJob {
	return []NewJob{{
		Type: sartiq.TypeProductIngest, OrganizationID: org, SeedKey: "demo:" + org + ":product_ingest" + batch,
		Instructions: "Propose one product for each row of catalog.csv that is not in the catalogue yet.",
		Sources: []sartiq.ManifestSource{{Name: "catalog.csv", MediaType: "text/csv",
			Content: "sku,name,price\n" + org + "-101,Trail Shoe,89.00\n" + org + "-102,Rain Shell,129.00\n" + org + "-103,Wool Beanie,25.00\n"}},
	}, {
		Type: sartiq.TypeGuidelinesExtraction, OrganizationID: org, SeedKey: "demo:" + org + ":guidelines_extraction" + batch,
		Instructions: "Extract the brand guidelines of every category from brand-book.md, one proposal per category.",
		Categories:   DemoCategories,
		Sources: []sartiq.ManifestSource{{Name: "brand-book.md", MediaType: "text/markdown",
			Content: "# " + demoName(org) + " brand book\n\n## Tone of voice\nPlain, warm, never shouting.\n\n" +
				"## Logo usage\nKeep clear space of one logo height; never recolour.\n\n" +
				"## Color palette\nNight blue #1B2A4A, signal orange #F26B1D, paper #F7F4EE.\n\n" +
				"## Typography\nHeadlines in Inter Bold, body in Source Serif.\n\n" +
				"## Imagery\nNatural light, real customers, no stock handshakes.\n"}},
	}}
}

// QueueDemoBatch queues a fresh batch of the demo jobs (named batch) unless a demo job is
// still queued, claimed or running, so that every local run has jobs to show and none piles
// up behind another. It reports whether it queued them.
func QueueDemoBatch(ctx context.Context, db *pgxpool.Pool, now time.Time, batch string) (bool, error) {
	var live bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM agent_jobs WHERE seed_key LIKE 'demo:%' AND status IN ('QUEUED', 'CLAIMED', 'RUNNING'))`).Scan(&live); err != nil {
		return false, fmt.Errorf("queue demo jobs: %w", err)
	}
	if live {
		return false, nil
	}
	for _, org := range DemoOrganizations {
		for _, j := range demoJobs(org, ":"+batch) {
			if _, err := CreateJob(ctx, db, j, now); err != nil {
				return false, fmt.Errorf("queue demo jobs: %w", err)
			}
		}
	}
	return true, nil
}

func demoName(org string) string {
	return map[string]string{"acme": "Acme Outdoor", "globex": "Globex Gear"}[org]
}

var demoProducts = []struct{ name, description, attributes string }{
	{"Summit Backpack", "A 30 l pack for day hikes.", `{"color": "night blue", "price": "119.00"}`},
	{"Ridge Jacket", "A windproof softshell.", `{"color": "signal orange", "price": "159.00"}`},
	{"Camp Mug", "Enamel, 350 ml.", `{"color": "paper", "price": "14.00"}`},
}
