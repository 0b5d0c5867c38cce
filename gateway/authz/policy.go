package authz

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/chaingate/gateway/chain"
)

// Policy is who may do what under a config's [gateway.auth]: the roles it
// defines and the built-in ones, and who holds them.
type Policy struct {
	roles  map[string][]chain.Grant
	users  map[string][]string
	groups map[string][]string
	// named is whether the config defines roles or gives them to people:
	// then a Slack user it does not name has no role, where before roles a
	// Slack user could answer any approval.
	named bool
}

// everything is the grant of the built-in admin role.
var everything = chain.Grant{Actions: chain.Actions}

// NewPolicy compiles a's roles.
func NewPolicy(a chain.Auth) *Policy {
	p := &Policy{
		roles: map[string][]chain.Grant{
			chain.RoleAdmin:    {everything},
			chain.RoleReader:   {{Actions: []Action{Read}}},
			chain.RoleApprover: {{Actions: []Action{Read, Approve}, Chains: []string{"*"}}},
		},
		users:  a.Users,
		groups: a.Groups,
		named:  len(a.Roles)+len(a.Users)+len(a.Groups) > 0,
	}
	for name, r := range a.Roles {
		p.roles[name] = r.Grants
	}
	return p
}

// RolesOf are the roles s holds: a token's own, or what its kind may do
// without them; a person's by name and by group.
func (p *Policy) RolesOf(s Subject) []string {
	switch s.Kind {
	case Token:
		switch {
		case len(s.Roles) > 0:
			return s.Roles
		case s.Write:
			return []string{chain.RoleAdmin}
		}
		return []string{chain.RoleReader}
	case Slack, Person:
		roles := slices.Clone(p.users[s.Name])
		for _, g := range s.Groups {
			roles = append(roles, p.groups[g]...)
		}
		if s.Kind == Slack && !p.named {
			roles = append(roles, chain.RoleApprover)
		}
		slices.Sort(roles)
		return slices.Compact(roles)
	}
	return nil
}

// Decide answers whether s may do a on t: nil, or a *Denied saying what is
// missing. A loopback client of a gateway without tokens may do anything;
// a trigger's credential only deliver to that trigger; a Slack user only
// answer approvals; anyone else what the roles it holds grant.
func (p *Policy) Decide(s Subject, a Action, t Target) error {
	deny := func(missing string) error { return &Denied{Subject: s, Action: a, Target: t, Missing: missing} }
	switch s.Kind {
	case Loopback:
		return nil
	case Trigger:
		if a == Deliver && t.Kind == OnTrigger && t.Name == s.Trigger {
			return nil
		}
		return deny(fmt.Sprintf("trigger %q's credential may only deliver to that trigger", s.Trigger))
	case Slack:
		if a != Approve {
			return deny("a Slack user may only answer approvals")
		}
	case Token, Person:
	default:
		return deny("the subject proved no identity")
	}
	roles := p.RolesOf(s)
	for _, r := range roles {
		for _, g := range p.roles[r] {
			if grants(g, a, t) {
				return nil
			}
		}
	}
	if len(roles) == 0 {
		return deny(fmt.Sprintf("%s holds no role: give it one in [gateway.auth]", s.Name))
	}
	if s.Kind == Token && len(s.Roles) == 0 && !s.Write {
		return deny("this token may only read")
	}
	return deny(fmt.Sprintf("no role of %s (%s) grants %s on %s", s.Name, strings.Join(roles, ", "), a, t.scope()))
}

// grants reports whether g lets its holder do a on t.
func grants(g chain.Grant, a Action, t Target) bool {
	if !slices.Contains(g.Actions, a) {
		return false
	}
	if g.Chains == nil && g.Triggers == nil && g.Schedules == nil {
		return true
	}
	switch t.Kind {
	case OnChain:
		return match(g.Chains, t.Name)
	case OnRun:
		return match(g.Chains, t.Chain)
	case OnDLQ:
		if t.Trigger != "" {
			return match(g.Triggers, t.Trigger)
		}
		return match(g.Chains, t.Chain)
	case OnTrigger:
		return match(g.Triggers, t.Name)
	case OnSchedule:
		return match(g.Schedules, t.Name)
	}
	return false
}

// match reports whether name matches one of patterns. The empty name is
// every one of a kind, which only "*" matches.
func match(patterns []string, name string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// MayChange reports whether s may do anything but read, on something.
func (p *Policy) MayChange(s Subject) bool {
	switch s.Kind {
	case Loopback:
		return true
	case Token, Person, Slack:
		for _, r := range p.RolesOf(s) {
			for _, g := range p.roles[r] {
				if slices.ContainsFunc(g.Actions, func(a Action) bool { return a != Read }) {
					return true
				}
			}
		}
	}
	return false
}

// Scoped reports whether what s may do on a run can depend on the run's
// chain, so that it is worth reading the run to find it.
func (p *Policy) Scoped(s Subject) bool {
	if s.Kind != Token && s.Kind != Person && s.Kind != Slack {
		return false
	}
	for _, r := range p.RolesOf(s) {
		for _, g := range p.roles[r] {
			if g.Chains != nil || g.Triggers != nil {
				return true
			}
		}
	}
	return false
}

// scope is t as a denial names it.
func (t Target) scope() string {
	switch {
	case t.Kind == OnRun && t.Name == "" && t.Chain != "":
		return "the runs of chain " + t.Chain
	case t.Kind == OnDLQ && t.Name == "" && t.Chain != "":
		return "the dead letters of chain " + t.Chain
	case t.Kind == OnRun && t.Name == "":
		return "the runs of every chain"
	case t.Kind == OnDLQ && t.Name == "":
		return "the dead letters of every chain"
	case t.Kind == OnChain && t.Name == "":
		return "every chain"
	case (t.Kind == OnRun || t.Kind == OnDLQ) && t.Trigger != "":
		return fmt.Sprintf("%s (trigger %s)", t, t.Trigger)
	case (t.Kind == OnRun || t.Kind == OnDLQ) && t.Chain != "":
		return fmt.Sprintf("%s (chain %s)", t, t.Chain)
	case t.Kind == OnTrigger && t.Name == "", t.Kind == OnSchedule && t.Name == "":
		return "every " + t.Kind
	}
	return t.String()
}
