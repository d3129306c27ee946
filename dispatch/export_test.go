package dispatch

// CrashBackoff is crashBackoff, for the tests of package dispatch_test.
var CrashBackoff = crashBackoff
