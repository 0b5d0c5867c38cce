// Package scaffold writes a new provider plugin module: a main serving the
// provider through plugins.Serve, a provider with one action, its test, a
// README and the payloads "gateway plugin check" sends. The module builds
// against a checkout of the gateway, through a replace directive, until the
// gateway module is published.
package scaffold

import (
	"bufio"
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"
)

// GatewayModule is the module path plugins import the contract from.
const GatewayModule = "github.com/chaingate/gateway"

//go:embed template
var files embed.FS

// Options says what to generate. Name and GatewaySrc are required.
type Options struct {
	// Name is the provider's name, as chains' configs and logs show it.
	Name string
	// Dir is where the module goes; default ./NAME-provider. It must not
	// exist, or be empty.
	Dir string
	// Module is the new module's path; default example.com/NAME-provider.
	Module string
	// GatewaySrc is the gateway checkout the module builds against; see
	// FindGatewaySrc.
	GatewaySrc string
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,39}$`)

// data is what the templates see.
type data struct {
	Name       string
	Module     string
	GatewaySrc string
	GoVersion  string
}

// Generate writes the module and returns the files it wrote, relative to
// opts.Dir.
func Generate(opts Options) ([]string, error) {
	if !nameRE.MatchString(opts.Name) {
		return nil, fmt.Errorf("provider name %q: use lower-case letters, digits and '-', starting with a letter, at most 40", opts.Name)
	}
	if opts.Dir == "" {
		opts.Dir = opts.Name + "-provider"
	}
	if opts.Module == "" {
		opts.Module = "example.com/" + opts.Name + "-provider"
	}
	src, err := filepath.Abs(opts.GatewaySrc)
	if err != nil {
		return nil, fmt.Errorf("resolving the gateway checkout: %w", err)
	}
	goVersion, err := checkoutGoVersion(src)
	if err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(opts.Dir); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("writing the plugin module: %s exists and is not empty", opts.Dir)
	}
	d := data{Name: opts.Name, Module: opts.Module, GatewaySrc: src, GoVersion: goVersion}
	var written []string
	err = fs.WalkDir(files, "template", func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		// Kept as .tmpl in the gateway's tree: a go.mod there would cut the
		// directory out of the module, and .go files would be compiled.
		rel := strings.TrimSuffix(strings.TrimPrefix(path, "template/"), ".tmpl")
		if rel == "gitignore" {
			rel = ".gitignore" // embed leaves out dot files
		}
		text, err := files.ReadFile(path)
		if err != nil {
			return err
		}
		tpl, err := template.New(rel).Parse(string(text))
		if err != nil {
			return fmt.Errorf("parsing template %s: %w", path, err)
		}
		var out bytes.Buffer
		if err := tpl.Execute(&out, d); err != nil {
			return fmt.Errorf("rendering %s: %w", rel, err)
		}
		dst := filepath.Join(opts.Dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("writing the plugin module: %w", err)
		}
		if err := os.WriteFile(dst, out.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing the plugin module: %w", err)
		}
		written = append(written, rel)
		return nil
	})
	return written, err
}

// FindGatewaySrc walks up from dir to the checkout of the gateway module:
// the first directory whose go.mod declares GatewayModule.
func FindGatewaySrc(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("finding the gateway checkout: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if mod, err := modulePath(filepath.Join(d, "go.mod")); err == nil && mod == GatewayModule {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no checkout of %s at or above %s: pass --gateway-src DIR, the directory holding its go.mod", GatewayModule, dir)
		}
	}
}

// checkoutGoVersion checks that src is a gateway checkout and returns the
// go directive of its go.mod, which the new module shares.
func checkoutGoVersion(src string) (string, error) {
	gomod := filepath.Join(src, "go.mod")
	mod, err := modulePath(gomod)
	if err != nil {
		return "", fmt.Errorf("reading the gateway checkout: %w", err)
	}
	if mod != GatewayModule {
		return "", fmt.Errorf("%s declares module %s, not %s: point --gateway-src at a checkout of the gateway", gomod, mod, GatewayModule)
	}
	version, err := directive(gomod, "go")
	if err != nil {
		return "", fmt.Errorf("reading the gateway checkout: %w", err)
	}
	return version, nil
}

func modulePath(gomod string) (string, error) {
	return directive(gomod, "module")
}

// directive returns the argument of the first go.mod line that starts
// with the keyword.
func directive(gomod, keyword string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "//")
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), keyword+" "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("reading %s: %w", gomod, err)
	}
	return "", fmt.Errorf("%s has no %s directive", gomod, keyword)
}
