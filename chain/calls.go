package chain

import "github.com/chaingate/gateway/templates"

// Call is one provider call a config can make: a provider step, at any
// depth, or an approval step's notify or escalate. Whatever checks what a
// provider is asked (its action types, the calls its config declares)
// walks Config.Calls, so that a new kind of call is checked by adding it
// here, not by remembering each check.
type Call struct {
	// Name says who calls: the step's name, or "STEP.notify" and
	// "STEP.escalate" for an approval's calls.
	Name       string
	Provider   string
	ActionType string
	// Payload is nil when the call writes none.
	Payload *templates.Template
	// Source is where the call is written; its action_type and
	// payload_template keys are below it.
	Source Source
}

// Calls lists the provider calls of a step, its sub-steps left out.
func (s *Step) Calls() []Call {
	var out []Call
	if s.Kind == KindProvider {
		out = append(out, Call{Name: s.Name, Provider: s.Provider, ActionType: s.ActionType, Payload: s.Payload, Source: s.Source})
	}
	if a := s.Approval; a != nil {
		for _, c := range []struct {
			what string
			call *ApprovalCall
		}{{"notify", a.Notify}, {"escalate", a.Escalate}} {
			if c.call != nil {
				out = append(out, Call{Name: s.Name + "." + c.what, Provider: c.call.Provider, ActionType: c.call.ActionType, Payload: c.call.Payload, Source: c.call.Source})
			}
		}
	}
	return out
}

// Calls lists every provider call of every chain, in definition order.
func (c *Config) Calls() []Call {
	var out []Call
	for _, name := range c.ChainNames {
		c.Chains[name].WalkChain(func(s *Step) { out = append(out, s.Calls()...) })
	}
	return out
}
