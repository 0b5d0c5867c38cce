package providers

// ReservedActionPrefix starts the action types that belong to the gateway
// itself, such as the conformance probe that plugins.Serve answers before a
// provider sees the call. A provider must not declare one, and a chain step
// must not use one.
const ReservedActionPrefix = "chaingate."
