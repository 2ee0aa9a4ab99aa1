"""effectq.dramatiq: the middleware on Dramatiq's StubBroker."""
