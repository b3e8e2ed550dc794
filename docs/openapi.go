// Package docs holds the API's OpenAPI 3.1 document (openapi.yaml, the
// reference of every route; API.md explains the concepts), embedded so
// the server can serve it. Its tests keep the Markdown docs' links valid.
package docs

import (
	_ "embed"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v4"
)

// OpenAPIYAML is docs/openapi.yaml as written.
//
//go:embed openapi.yaml
var OpenAPIYAML []byte

// OpenAPIJSON returns the document converted to JSON, or an error when
// the YAML does not parse (a build of a broken document).
func OpenAPIJSON() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(OpenAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("docs: parse openapi.yaml: %w", err)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("docs: openapi.yaml as JSON: %w", err)
	}
	return out, nil
}
