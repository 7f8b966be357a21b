package ops

import "context"

// Group returns a group's size (every message filed under it: scheduled,
// in flight and dead) and a page of its messages in the order they fire,
// as List lists them with the group's filter.
func (s *Service) Group(ctx context.Context, key string, q ListQuery) (*GroupView, error) {
	if err := s.checkID("key", "the group", key); err != nil {
		return nil, err
	}
	q.Group = key
	bq, verr := s.listBrowse(q) // a query that is wrong is a 400 whether or not the group exists
	if verr != nil {
		return nil, verr
	}
	n, err := s.p.Store.GroupSize(ctx, key)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, noGroup(key)
	}
	v, err := s.browse(ctx, bq, q.Content)
	if err != nil {
		return nil, err
	}
	return &GroupView{Group: key, Count: n, ListView: *v}, nil
}

// CancelGroup cancels every scheduled and dead message of a group; those
// in flight are left, and counted (as Cancel refuses one).
func (s *Service) CancelGroup(ctx context.Context, key string) (*CancelGroupView, error) {
	if err := s.checkID("key", "the group", key); err != nil {
		return nil, err
	}
	n, inflight, err := s.p.Store.CancelGroup(ctx, key)
	switch {
	case err != nil:
		return nil, err
	case n == 0 && inflight == 0:
		return nil, noGroup(key)
	}
	return &CancelGroupView{Group: key, Cancelled: n, InFlight: inflight}, nil
}
