package loader

import (
	"maps"
	"path"
	"slices"
	"strings"
	"unicode"

	"github.com/chaingate/gateway/chain"
)

// authExample is a [gateway.auth] that grants something, shown where a
// config grants nothing to anyone.
const authExample = `[gateway.auth.roles.oncall]
grants = [{ actions = ["read", "approve", "cancel"], chains = ["*"] }]

[gateway.auth.groups]
sre = ["oncall"]`

var builtinRoles = []string{chain.RoleAdmin, chain.RoleReader, chain.RoleApprover}

// auth decodes [gateway.auth]: API tokens, roles and who holds them.
func (l *loader) auth(t *table) chain.Auth {
	a := chain.Auth{Source: t.d.source(t.path), Roles: map[string]*chain.Role{}}
	a.Tokens = t.tokens("tokens")
	a.ReadTokens = t.tokens("read_tokens")
	if rt, ok := t.sub("roles"); ok {
		for _, name := range slices.Sorted(maps.Keys(rt.m)) {
			at := rt.path.Key(name)
			switch {
			case slices.Contains(builtinRoles, name):
				t.d.errorf(at, "%q is a built-in role (%s): give it, or define a role of another name", name, quoteList(builtinRoles))
				continue
			case !nameRE.MatchString(name):
				t.d.errorf(at, "role name %q may hold only letters, digits, '_' and '-', and must not start with '-'", name)
				continue
			}
			if tb, ok := t.d.table(at, rt.m[name]); ok {
				a.Roles[name] = decodeRole(tb, name)
			}
		}
	}
	a.Users = t.roleMap("users", "person", `{ alice = ["oncall"] }`)
	a.Groups = t.roleMap("groups", "group", `{ sre = ["oncall"] }`)
	t.finish([]string{"tokens", "read_tokens", "roles", "users", "groups"})
	l.checkRoleNames(t, &a)
	return a
}

// decodeRole reads one [gateway.auth.roles.NAME] table.
func decodeRole(t *table, name string) *chain.Role {
	r := &chain.Role{Name: name, Source: t.d.source(t.path)}
	grants, ok := t.tables("grants")
	if !ok {
		t.d.errorf(t.path, `missing required key "grants": what the role may do, e.g. grants = [{ actions = ["read", "approve"], chains = ["disk-*"] }]`)
	} else if len(grants) == 0 {
		t.d.errorf(t.path.Key("grants"), `grants nothing: give at least one grant, e.g. { actions = ["read"], chains = ["*"] }`)
	}
	for _, gt := range grants {
		if g, ok := decodeGrant(gt); ok {
			r.Grants = append(r.Grants, g)
		}
	}
	t.finish([]string{"grants"})
	return r
}

// actionKinds are the kinds of target each action is on; an action on
// the gateway takes a grant with no patterns.
var actionKinds = map[chain.Action][]string{
	chain.ActionRead:    {"chains", "triggers", "schedules"},
	chain.ActionStart:   {"chains"},
	chain.ActionDeliver: {"triggers"},
	chain.ActionApprove: {"chains"},
	chain.ActionCancel:  {"chains"},
	chain.ActionReplay:  {"chains", "triggers"},
	chain.ActionRedrive: {"chains"},
	chain.ActionPause:   {"triggers", "schedules"},
	chain.ActionDelete:  {"chains", "triggers"},
	chain.ActionBackup:  nil,
	chain.ActionAdmin:   nil,
}

func decodeGrant(t *table) (chain.Grant, bool) {
	g := chain.Grant{Source: t.d.source(t.path)}
	ok := true
	names := make([]string, len(chain.Actions))
	for i, a := range chain.Actions {
		names[i] = string(a)
	}
	if !t.has("actions") {
		t.d.errorf(t.path, `missing required key "actions": what the grant allows, some of %s`, quoteList(names))
		ok = false
	}
	for i, s := range t.strings("actions") {
		a := chain.Action(s)
		if _, known := actionKinds[a]; !known {
			msg := "unknown action %q; want one of %s"
			if sug := chain.Suggest(s, names); sug != "" {
				msg = "unknown action %q (did you mean %q?)"
				t.d.errorf(t.path.Key("actions").Elem(i, ""), msg, s, sug)
			} else {
				t.d.errorf(t.path.Key("actions").Elem(i, ""), msg, s, quoteList(names))
			}
			ok = false
			continue
		}
		g.Actions = append(g.Actions, a)
	}
	if t.has("actions") && len(g.Actions) == 0 && ok {
		t.d.errorf(t.path.Key("actions"), "grants no action: give at least one of %s", quoteList(names))
		ok = false
	}
	g.Chains = t.patterns("chains")
	g.Triggers = t.patterns("triggers")
	g.Schedules = t.patterns("schedules")
	t.finish([]string{"actions", "chains", "triggers", "schedules"})
	if len(g.Chains)+len(g.Triggers)+len(g.Schedules) == 0 {
		return g, ok
	}
	// A grant with patterns is on those kinds only: an action on none of
	// them would grant nothing, which is a mistake worth saying.
	for i, a := range g.Actions {
		kinds := actionKinds[a]
		on := false
		for _, k := range kinds {
			on = on || (k == "chains" && g.Chains != nil) || (k == "triggers" && g.Triggers != nil) || (k == "schedules" && g.Schedules != nil)
		}
		if on {
			continue
		}
		if len(kinds) == 0 {
			t.d.errorf(t.path.Key("actions").Elem(i, ""), "%q is on the gateway itself, not on chains, triggers or schedules: give it in a grant without patterns, e.g. { actions = [%q] }", a, a)
		} else {
			t.d.errorf(t.path.Key("actions").Elem(i, ""), "%q is on %s, and this grant names none of them", a, strings.Join(kinds, " or "))
		}
		ok = false
	}
	return g, ok
}

// patterns reads an array of name patterns (path.Match globs: *, ?, [a-z]).
func (t *table) patterns(k string) []string {
	v, ok := t.value(k)
	if !ok {
		return nil
	}
	if arr, isArr := v.([]any); isArr && len(arr) == 0 {
		t.d.errorf(t.path.Key(k), "names nothing: give a name or a pattern, \"*\" for every one, or leave the key out")
	}
	out := []string{}
	for i, p := range t.strings(k) {
		if _, err := path.Match(p, ""); err != nil || strings.Contains(p, "/") {
			t.d.errorf(t.path.Key(k).Elem(i, ""), "%q is not a name pattern: want a name, or a glob such as \"disk-*\" or \"*\"", p)
			continue
		}
		out = append(out, p)
	}
	return out
}

// roleMap reads a table of names to the roles they hold.
func (t *table) roleMap(k, what, example string) map[string][]string {
	out := map[string][]string{}
	v, ok := t.value(k)
	if !ok {
		return out
	}
	m, isTable := v.(map[string]any)
	if !isTable {
		t.d.errorf(t.path.Key(k), "must be a table of %s names to the roles they hold, e.g. %s, got %s", what, example, describe(v))
		return out
	}
	for _, name := range slices.Sorted(maps.Keys(m)) {
		at := t.path.Key(k).Key(name)
		if strings.TrimSpace(name) == "" || strings.ContainsFunc(name, unicode.IsControl) {
			t.d.errorf(at, "a %s name must not be blank or hold control characters", what)
			continue
		}
		sub := &table{d: t.d, path: t.path.Key(k), m: m}
		roles := sub.strings(name)
		if _, isArr := m[name].([]any); isArr && len(roles) == 0 {
			t.d.errorf(at, "gives no role: name at least one, e.g. %s", example)
		}
		out[name] = roles
	}
	return out
}

// checkRoleNames reports every role given that is neither defined nor
// built in, and a config that defines roles but gives none to anyone.
func (l *loader) checkRoleNames(t *table, a *chain.Auth) {
	known := slices.Concat(builtinRoles, slices.Sorted(maps.Keys(a.Roles)))
	check := func(p chain.KeyPath, roles []string) {
		for i, r := range roles {
			if slices.Contains(known, r) {
				continue
			}
			msg := "unknown role %q; the config defines " + quoteList(known)
			if sug := chain.Suggest(r, known); sug != "" {
				t.d.errorf(p.Elem(i, ""), "unknown role %q (did you mean %q?)", r, sug)
				continue
			}
			t.d.errorf(p.Elem(i, ""), msg, r)
		}
	}
	given := false
	for i, tok := range a.Tokens {
		check(t.path.Key("tokens").Elem(i, "").Key("roles"), tok.Roles)
		given = true
	}
	for i, tok := range a.ReadTokens {
		check(t.path.Key("read_tokens").Elem(i, "").Key("roles"), tok.Roles)
		given = true
	}
	for _, name := range slices.Sorted(maps.Keys(a.Users)) {
		check(t.path.Key("users").Key(name), a.Users[name])
		given = given || len(a.Users[name]) > 0
	}
	for _, name := range slices.Sorted(maps.Keys(a.Groups)) {
		check(t.path.Key("groups").Key(name), a.Groups[name])
		given = given || len(a.Groups[name]) > 0
	}
	if len(a.Roles) > 0 && !given {
		t.d.errorf(t.path, "defines roles but gives them to no one, so no one may do anything: give roles to tokens (roles = [...]), to people ([gateway.auth.users]) or to sign-in groups ([gateway.auth.groups]), e.g.\n%s", authExample)
	}
}
