package command

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Arg is one argument a command declares: its type and the rule a value
// must pass. The rule is enforced by the provider on every call, whatever
// made it, before anything runs; a value that fails it fails the call for
// good, naming the argument, the value and the rule.
type Arg struct {
	// Type is string, integer, boolean, hostname or path.
	Type        string `json:"type"`
	Description string `json:"description"`
	// Required is true unless the argument has a Default or says false.
	Required *bool `json:"required"`
	// Default is the value of an argument a call leaves out.
	Default json.RawMessage `json:"default"`
	// Secret keeps the value out of messages.
	Secret bool `json:"secret"`
	// Pattern is a regular expression (RE2) the whole value must match;
	// Enum the values it may be. For string, hostname and path.
	Pattern string   `json:"pattern"`
	Enum    []string `json:"enum"`
	// MinLength (default 1) and MaxLength bound a value's characters;
	// AllowLeadingDash lets a string start with '-'.
	MinLength        *int `json:"min_length"`
	MaxLength        int  `json:"max_length"`
	AllowLeadingDash bool `json:"allow_leading_dash"`
	// Min (default 0) and Max bound an integer.
	Min *int64 `json:"min"`
	Max *int64 `json:"max"`
	// Roots are the directories a path must lie in.
	Roots []string `json:"roots"`

	re *regexp.Regexp
}

// The argument types.
const (
	TypeString   = "string"
	TypeInteger  = "integer"
	TypeBoolean  = "boolean"
	TypeHostname = "hostname"
	TypePath     = "path"
)

// Default lengths, in characters, of a value that declares no max_length.
const (
	DefaultMaxString = 1024
	DefaultMaxPath   = 4096
	maxHostname      = 253
)

// options lists which keys of an argument each type takes, besides type,
// description, required, default and secret.
var options = map[string][]string{
	TypeString:   {"pattern", "enum", "min_length", "max_length", "allow_leading_dash"},
	TypeInteger:  {"min", "max"},
	TypeBoolean:  nil,
	TypeHostname: {"pattern", "enum"},
	TypePath:     {"roots", "pattern", "max_length"},
}

// set lists the type-specific keys a has set.
func (a *Arg) set() []string {
	var keys []string
	for k, on := range map[string]bool{
		"pattern": a.Pattern != "", "enum": a.Enum != nil, "min_length": a.MinLength != nil, "max_length": a.MaxLength != 0,
		"allow_leading_dash": a.AllowLeadingDash, "min": a.Min != nil, "max": a.Max != nil, "roots": a.Roots != nil,
	} {
		if on {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// compile checks the declaration and compiles its pattern.
func (a *Arg) compile() error {
	allowed, ok := options[a.Type]
	if !ok {
		return fmt.Errorf("type %q is not an argument type: string, integer, boolean, hostname or path", a.Type)
	}
	for _, k := range a.set() {
		if !slices.Contains(allowed, k) {
			return fmt.Errorf("%s does not apply to a %s argument", k, a.Type)
		}
	}
	if a.Pattern != "" {
		// Anchored, so that a pattern written for the whole value cannot
		// be met by a part of it.
		re, err := regexp.Compile(`^(?:` + a.Pattern + `)$`)
		if err != nil {
			return fmt.Errorf("pattern: %w", err)
		}
		a.re = re
	}
	switch {
	case a.MinLength != nil && *a.MinLength < 0:
		return errors.New("min_length must not be negative")
	case a.MaxLength < 0:
		return errors.New("max_length must be positive")
	case a.MinLength != nil && a.MaxLength > 0 && *a.MinLength > a.MaxLength:
		return errors.New("min_length is above max_length")
	case a.Min != nil && a.Max != nil && *a.Min > *a.Max:
		return errors.New("min is above max")
	case a.Type == TypePath && len(a.Roots) == 0:
		return errors.New(`a path argument names the directories it must lie in: roots = ["/var/log"]`)
	case a.Required != nil && *a.Required && a.Default != nil:
		return errors.New("an argument with a default is not required; drop one of the two")
	}
	for i, r := range a.Roots {
		if !path.IsAbs(r) || path.Clean(r) != r {
			return fmt.Errorf("roots[%d] %q must be an absolute path written plainly (%q)", i, r, path.Clean("/"+r))
		}
	}
	for i, e := range a.Enum {
		if _, err := a.Value(jsonString(e), nil); err != nil {
			return fmt.Errorf("enum[%d]: %w", i, err)
		}
	}
	if a.Default != nil {
		if _, err := a.Value(a.Default, nil); err != nil {
			return fmt.Errorf("default: %w", err)
		}
	}
	return nil
}

// IsRequired reports whether a call must give the argument.
func (a *Arg) IsRequired() bool {
	if a.Required != nil {
		return *a.Required
	}
	return a.Default == nil
}

// Confiner checks, beyond the lexical rule, that a path lies in one of
// roots as the machine it is used on resolves it (symbolic links).
type Confiner func(p string, roots []string) error

// Value checks a JSON value against the argument's rule and returns the
// text the command gets. confine, when not nil, is asked about paths.
func (a *Arg) Value(v json.RawMessage, confine Confiner) (string, error) {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || string(v) == "null" {
		return "", errors.New("is null; give a value")
	}
	switch a.Type {
	case TypeInteger:
		return a.integer(v)
	case TypeBoolean:
		return boolean(v)
	}
	s, err := a.text(v)
	if err != nil {
		return "", err
	}
	if err := plain(s); err != nil {
		return "", err
	}
	switch a.Type {
	case TypeString:
		if s, err = a.str(s); err != nil {
			return "", err
		}
	case TypeHostname:
		if err := hostname(s); err != nil {
			return "", err
		}
	case TypePath:
		if s, err = a.path(s, confine); err != nil {
			return "", err
		}
	}
	if a.Enum != nil && !slices.Contains(a.Enum, s) {
		return "", fmt.Errorf("is not one of %s", quoteList(a.Enum))
	}
	if a.re != nil && !a.re.MatchString(s) {
		return "", fmt.Errorf("does not match the pattern %s", a.Pattern)
	}
	return s, nil
}

// text is a JSON value that a textual argument takes: a string, or for a
// string argument a number or boolean as written.
func (a *Arg) text(v json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s, nil
	}
	if a.Type == TypeString && (v[0] == '-' || v[0] >= '0' && v[0] <= '9' || string(v) == "true" || string(v) == "false") {
		return string(v), nil
	}
	return "", fmt.Errorf("is not a %s: a %s argument takes a string", kindOf(v), a.Type)
}

// plain refuses what no argument of any type should carry: bytes that are
// not UTF-8 and control characters (a newline, a NUL, an escape).
func plain(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return fmt.Errorf("holds a control character (%U at byte %d), which no argument may carry", r, i)
	}
	return nil
}

func (a *Arg) str(s string) (string, error) {
	n := utf8.RuneCountInString(s)
	minLen, maxLen := 1, DefaultMaxString
	if a.MinLength != nil {
		minLen = *a.MinLength
	}
	if a.MaxLength > 0 {
		maxLen = a.MaxLength
	}
	switch {
	case n < minLen && n == 0:
		return "", errors.New("is empty (min_length = 0 allows it)")
	case n < minLen:
		return "", fmt.Errorf("is %d characters, under min_length = %d", n, minLen)
	case n > maxLen:
		return "", fmt.Errorf("is %d characters, over max_length = %d", n, maxLen)
	case strings.HasPrefix(s, "-") && !a.AllowLeadingDash:
		return "", errors.New("starts with '-', which a program would read as an option (allow_leading_dash = true allows it)")
	}
	return s, nil
}

func (a *Arg) integer(v json.RawMessage) (string, error) {
	text := string(v)
	var s string
	if json.Unmarshal(v, &s) == nil {
		text = s
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || strings.HasPrefix(text, "+") {
		return "", fmt.Errorf("is not an integer")
	}
	lo := int64(0)
	if a.Min != nil {
		lo = *a.Min
	}
	switch {
	case n < lo && a.Min == nil:
		return "", errors.New("is negative (min = -N allows it)")
	case n < lo:
		return "", fmt.Errorf("is under min = %d", lo)
	case a.Max != nil && n > *a.Max:
		return "", fmt.Errorf("is over max = %d", *a.Max)
	}
	return strconv.FormatInt(n, 10), nil
}

func boolean(v json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(v, &s) != nil {
		s = string(v)
	}
	if s != "true" && s != "false" {
		return "", errors.New("is not true or false")
	}
	return s, nil
}

// hostname refuses what is neither an IP address nor a DNS name of
// RFC 1123 labels.
func hostname(s string) error {
	if addr, err := netip.ParseAddr(s); err == nil {
		if addr.Zone() != "" {
			return errors.New("is an address with a zone, which a hostname argument does not take")
		}
		return nil
	}
	if len(s) == 0 || len(s) > maxHostname {
		return fmt.Errorf("is not a host name (1 to %d characters)", maxHostname)
	}
	for _, label := range strings.Split(s, ".") {
		ok := len(label) > 0 && len(label) <= 63 && label[0] != '-' && label[len(label)-1] != '-'
		for i := 0; ok && i < len(label); i++ {
			c := label[i]
			ok = c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		}
		if !ok {
			return errors.New("is not a host name: dot-separated labels of letters, digits and '-', none starting or ending with '-'")
		}
	}
	return nil
}

// path checks a path argument: absolute, no ".." anywhere, within a root
// once cleaned, and within it as the machine resolves it when confine is
// given. It returns the path cleaned.
func (a *Arg) path(s string, confine Confiner) (string, error) {
	maxLen := DefaultMaxPath
	if a.MaxLength > 0 {
		maxLen = a.MaxLength
	}
	switch {
	case utf8.RuneCountInString(s) > maxLen:
		return "", fmt.Errorf("is %d characters, over max_length = %d", utf8.RuneCountInString(s), maxLen)
	case !strings.HasPrefix(s, "/"):
		return "", fmt.Errorf("is not an absolute path; it must lie under %s", orList(a.Roots))
	case slices.Contains(strings.Split(s, "/"), ".."):
		return "", fmt.Errorf("holds '..'; it must lie under %s, named without '..'", orList(a.Roots))
	}
	clean := path.Clean(s)
	if !slices.ContainsFunc(a.Roots, func(root string) bool { return within(clean, root) }) {
		return "", fmt.Errorf("is not under %s", orList(a.Roots))
	}
	if confine != nil {
		if err := confine(clean, a.Roots); err != nil {
			return "", err
		}
	}
	return clean, nil
}

// within reports whether the clean path p is root or lies under it.
func within(p, root string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

// Within reports whether the clean path p is one of roots or lies under
// one, for a Confiner that resolves p.
func Within(p string, roots []string) bool {
	return slices.ContainsFunc(roots, func(root string) bool { return within(p, root) })
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

func kindOf(v json.RawMessage) string {
	switch v[0] {
	case '{':
		return "table"
	case '[':
		return "list"
	case 't', 'f':
		return "boolean"
	case '"':
		return "string"
	}
	return "number"
}

func quoteList(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

func orList(list []string) string {
	if len(list) == 1 {
		return list[0]
	}
	return strings.Join(list[:len(list)-1], ", ") + " or " + list[len(list)-1]
}
