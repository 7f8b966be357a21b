package rabbitbroker

// For the tests of package rabbitbroker_test.
var (
	SameField          = sameField
	EveryFieldType     = everyFieldType
	PublishCloseReason = closeReason
	KeepSent           = keepSent
	Silent             = silent
)
