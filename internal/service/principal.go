package service

import (
	"github.com/taskledger/taskledger/aggregate"
)

// Principal is who makes a request: a customer, or an operator who sees
// every customer.
type Principal struct {
	CustomerID string // "*" for an operator
}

// Operator is the principal of a server without an auth file.
var Operator = Principal{CustomerID: "*"}

// IsOperator reports whether p sees every customer.
func (p Principal) IsOperator() bool { return p.CustomerID == "*" }

// Scope is the customer whose tasks p sees and may claim, "" for every
// customer's (an operator).
func (p Principal) Scope() string {
	if p.IsOperator() {
		return ""
	}
	return p.CustomerID
}

// Sees reports whether s is a task that exists and that p may see.
func (p Principal) Sees(s aggregate.State) bool {
	return s.Exists() && (p.IsOperator() || p.CustomerID == s.CustomerID)
}
