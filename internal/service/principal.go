package service

import (
	"github.com/taskledger/taskledger/aggregate"
)

// Principal is who makes a request: a customer, or an operator who sees
// every customer.
type Principal struct {
	CustomerID string // "*" for an operator
	// Name is the name the auth file gives the request's token, "" when
	// it gives none (or there is no auth file). Actor uses it.
	Name string
}

// Actor is who the events appended on p's behalf name as their actor
// (events.Event.Actor): its Name, else "operator" for an operator and
// "customer:<id>" for a customer. What a claim's holder writes under
// its delivery token names the claim's executor instead (the aggregate
// does).
func (p Principal) Actor() string {
	switch {
	case p.Name != "":
		return p.Name
	case p.IsOperator():
		return "operator"
	}
	return "customer:" + p.CustomerID
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
