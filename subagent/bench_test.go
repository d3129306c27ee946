package subagent

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"hermeshost/internal/latency"

	"hermeshost/pg/pgtest"
)

// BenchmarkMailboxHandoff is the time from an operator's Send to the waiting child's Drain
// returning the message: woken by NOTIFY, beside a child that polls every 250 ms.
func BenchmarkMailboxHandoff(b *testing.B) {
	run := func(b *testing.B, wait func(ctx context.Context, s *Store, id string, ready chan<- struct{}) (Mailbox, error)) {
		_, pool := pgtest.Schema(b)
		s := New(pool, Options{Poll: time.Second})
		defer s.Close()
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		for i := range b.N {
			id := fmt.Sprintf("child-%d", i)
			if _, _, err := s.Start(ctx, "acme", Start{ID: id, Goal: "g"}); err != nil {
				b.Fatal(err)
			}
			ready := make(chan struct{})
			got := make(chan time.Time, 1)
			errc := make(chan error, 1)
			go func() {
				box, err := wait(ctx, s, id, ready)
				if err == nil && len(box.Messages) != 1 {
					err = fmt.Errorf("drained %d messages", len(box.Messages))
				}
				if err != nil {
					errc <- err
					return
				}
				got <- time.Now()
			}()
			<-ready
			sent := time.Now()
			if _, err := s.Send(ctx, "acme", id, "op", "hello"); err != nil {
				b.Fatal(err)
			}
			select {
			case at := <-got:
				lat = append(lat, at.Sub(sent))
			case err := <-errc:
				b.Fatal(err)
			}
		}
		b.StopTimer()
		latency.Report(b, lat)
	}
	b.Run("notify", func(b *testing.B) {
		run(b, func(ctx context.Context, s *Store, id string, ready chan<- struct{}) (Mailbox, error) {
			s.ensureListener(ctx)
			go func() {
				for !s.listener.Subscribed("acme/" + id) {
					time.Sleep(50 * time.Microsecond)
				}
				close(ready)
			}()
			return s.Drain(ctx, "acme", id, MaxWait)
		})
	})
	b.Run("poll-250ms", func(b *testing.B) {
		run(b, func(ctx context.Context, s *Store, id string, ready chan<- struct{}) (Mailbox, error) {
			var once sync.Once
			for {
				box, err := s.Drain(ctx, "acme", id, 0)
				once.Do(func() { close(ready) })
				if err != nil || len(box.Messages) > 0 {
					return box, err
				}
				time.Sleep(250 * time.Millisecond)
			}
		})
	})
}

// BenchmarkMessageRoundTrip is one message's life (Send, Drain, Ack) per operation at 1
// and 8 clients, each on its own child, beside the same three writes as bare statements on
// a table without checks, locks or indexes beyond its key.
func BenchmarkMessageRoundTrip(b *testing.B) {
	for _, c := range []int{1, 8} {
		b.Run(fmt.Sprintf("subagent/clients-%d", c), func(b *testing.B) {
			_, pool := pgtest.Schema(b)
			s := New(pool, Options{})
			defer s.Close()
			ctx := context.Background()
			for i := range c {
				if _, _, err := s.Start(ctx, "acme", Start{ID: fmt.Sprintf("child-%d", i), Goal: "g"}); err != nil {
					b.Fatal(err)
				}
			}
			clients(b, c, func(client int) error {
				id := fmt.Sprintf("child-%d", client)
				if _, err := s.Send(ctx, "acme", id, "op", "hello"); err != nil {
					return err
				}
				box, err := s.Drain(ctx, "acme", id, 0)
				if err != nil {
					return err
				}
				ids := make([]int64, 0, len(box.Messages))
				for _, m := range box.Messages {
					ids = append(ids, m.ID)
				}
				_, err = s.Ack(ctx, "acme", id, ids)
				return err
			})
		})
		b.Run(fmt.Sprintf("baseline/clients-%d", c), func(b *testing.B) {
			_, pool := pgtest.Schema(b)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, `CREATE TABLE baseline (id bigserial PRIMARY KEY, box text NOT NULL, body text NOT NULL, acked bool NOT NULL DEFAULT false)`); err != nil {
				b.Fatal(err)
			}
			clients(b, c, func(client int) error {
				box := fmt.Sprintf("child-%d", client)
				var id int64
				if err := pool.QueryRow(ctx, `INSERT INTO baseline (box, body) VALUES ($1, 'hello') RETURNING id`, box).Scan(&id); err != nil {
					return err
				}
				if _, err := pool.Exec(ctx, `UPDATE baseline SET body = body WHERE id = $1`, id); err != nil {
					return err
				}
				_, err := pool.Exec(ctx, `UPDATE baseline SET acked = true WHERE id = $1`, id)
				return err
			})
		})
	}
}

// clients runs b.N operations over c goroutines, each passing its client number, and
// reports operations per second.
func clients(b *testing.B, c int, op func(client int) error) {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c)
	b.ResetTimer()
	start := time.Now()
	for client := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(client); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}
