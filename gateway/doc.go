// Package gateway is the host's OpenAI-compatible model gateway and its one login.
//
// Every org container points its model configuration here, presenting a key derived
// from the gateway secret (OrgKey), so the provider login lives in exactly one process:
// one refresher, no refresh race between containers, and no provider credential inside
// a container an agent controls. The gateway forwards only to its one configured
// upstream, on fixed paths, and limits each org's rate and concurrency.
package gateway
