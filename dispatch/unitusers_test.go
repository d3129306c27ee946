package dispatch_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"hermeshost/dispatch"
	"hermeshost/pg/pgtest"
)

// Two dispatchers allocating at once, for the same orgs in opposite orders, give each org
// one uid, the same from both, and no two orgs one; later asks (a fresh process) find the
// same; the range's lowest free uids go first; a full range says so.
func TestEachOrgGetsAUidOfItsOwnFromEveryDispatcher(t *testing.T) {
	_, pool := pgtest.Schema(t)
	const n = 24
	first := 300000
	a, err := dispatch.NewUnitUsers(pool, first, first+n-1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dispatch.NewUnitUsers(pool, first, first+n-1)
	if err != nil {
		t.Fatal(err)
	}
	orgs := make([]string, n)
	for i := range orgs {
		orgs[i] = fmt.Sprintf("org-%02d", i)
	}
	got := [2]map[string]int{{}, {}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for side, users := range []*dispatch.UnitUsers{a, b} {
		for i := range orgs {
			org := orgs[i]
			if side == 1 {
				org = orgs[n-1-i]
			}
			wg.Go(func() {
				uid, gid, err := users.UserOf(context.Background(), org)
				if err != nil {
					t.Errorf("side %d, %s: %v", side, org, err)
					return
				}
				if gid != uid {
					t.Errorf("%s: gid %d, uid %d", org, gid, uid)
				}
				mu.Lock()
				got[side][org] = uid
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	owners := map[int]string{}
	for _, org := range orgs {
		uid := got[0][org]
		if got[1][org] != uid {
			t.Errorf("%s: uid %d from one dispatcher, %d from the other", org, uid, got[1][org])
		}
		if uid < first || uid >= first+n {
			t.Errorf("%s: uid %d outside %d-%d", org, uid, first, first+n-1)
		}
		if other, taken := owners[uid]; taken {
			t.Errorf("uid %d is both %s's and %s's", uid, other, org)
		}
		owners[uid] = org
	}
	// A fresh process (no memory of its own) finds the same.
	c, err := dispatch.NewUnitUsers(pool, first, first+n-1)
	if err != nil {
		t.Fatal(err)
	}
	for _, org := range orgs {
		if uid, _, err := c.UserOf(context.Background(), org); err != nil || uid != got[0][org] {
			t.Errorf("%s later: %d, %v; want %d", org, uid, err, got[0][org])
		}
	}
	// The range is full.
	if _, _, err := c.UserOf(context.Background(), "one-too-many"); err == nil || !strings.Contains(err.Error(), "no uid of 300000-300023 is free") {
		t.Fatalf("an org past the range: %v", err)
	}
	// A wider range gives the next org the lowest free uid, skipping the keeper's.
	d, err := dispatch.NewUnitUsers(pool, 65530, 65540)
	if err != nil {
		t.Fatal(err)
	}
	var seq []int
	for i := range 6 {
		uid, _, err := d.UserOf(context.Background(), fmt.Sprintf("wide-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		seq = append(seq, uid)
	}
	if fmt.Sprint(seq) != "[65530 65531 65532 65533 65535 65536]" {
		t.Fatalf("uids in order %v, want the lowest free ones without 65534", seq)
	}
	for _, bad := range [][2]int{{0, 10}, {10, 9}, {65534, 65534}} {
		if _, err := dispatch.NewUnitUsers(pool, bad[0], bad[1]); err == nil {
			t.Errorf("range %d-%d accepted", bad[0], bad[1])
		}
	}
}
