package backend

import "hermeshost/sartiq"

// botOperations are what the bot token may call.
var botOperations = set(
	"listAgentJobs",
	"claimAgentJob",
	"reclaimAgentJob",
	"listAgentJobEvents",
)

// jobTokenAllowlist decides every request made with a job token: capability (the job's
// type) to the operations it may call. Anything not listed is 403. Granting an endpoint is
// one line here; the path's job and organization are bound to the token separately.
var jobTokenAllowlist = map[string]map[string]bool{
	sartiq.TypeProductIngest: set(
		"startAgentJob", "heartbeatAgentJob", "addAgentJobEvent", "listAgentJobEvents", // the job's own endpoints
		"completeAgentJob", "failAgentJob", "releaseAgentJob", "getAgentJobManifest", // the job's own endpoints
		"listProducts",    // reads within its org
		"presignUpload",   // artifacts
		"proposeProducts", // its write surface
	),
	sartiq.TypeGuidelinesExtraction: set(
		"startAgentJob", "heartbeatAgentJob", "addAgentJobEvent", "listAgentJobEvents", // the job's own endpoints
		"completeAgentJob", "failAgentJob", "releaseAgentJob", "getAgentJobManifest", // the job's own endpoints
		"listProducts",      // reads within its org
		"presignUpload",     // artifacts
		"proposeGuidelines", // its write surface
	),
}

func set(ops ...string) map[string]bool {
	m := make(map[string]bool, len(ops))
	for _, op := range ops {
		m[op] = true
	}
	return m
}
