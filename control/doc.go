// Package control is the dispatcher's internal control API: how an org's own processes (the
// worker in its container, later its dashboard) reach durable state without the shared
// database credential. Each caller presents a per-org key the dispatcher minted for that
// org; the server derives the org from the key and scopes every query to it, so a caller
// names jobs and leases but never the org they belong to.
//
// It serves the org's rows of the job mirror and the org's leases: home:<own org>, and
// session:<id>, stored as session:<org>.<id> so that two orgs' sessions never share a
// lease. org: leases stay the dispatcher's. And it serves the org's subagent handles: the
// subagent_start and subagent_stop hooks, listing, a message into a child's mailbox, a
// cancel, and the child's own drain and acknowledgement of its mailbox.
package control
