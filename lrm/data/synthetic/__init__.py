"""Synthetic session-level ads-click logs with a hidden, learnable click model.

A day is `cfg.sessions_per_day` sessions, written in the order they happen (time of day)
as an impression log would be. A session is one user (Zipf-popular) at a time of day near
the user's preferred hour, on one vertical, seeing 1 + Poisson(mean_session_length - 1)
ads (Zipf-popular) in positions 0..n-1, ordered by a noisy auction score; its rows are
contiguous and share the user-side columns, including `user_history` (recent ad ids, most
recent first, ~0.8 * max_history long on average) and `vertical`.

Verticals (`cfg.verticals`) are the surfaces of one ads system (a feed, search results, a
video tab) over the same users and ads: a session lands on vertical j with probability
share_j (drawn from a stream of its own, so the rest of the day is the same whatever the
verticals). A vertical has its own base CTR (its own intercept), its own multiple of the
position effect, and a part of the click function of its own (`own`, below); everything
else is shared, so every vertical's data teaches the structure the others use. One
vertical with the defaults (share 1, position 1, own 0) is the single-surface world,
column for column (checked against the generator before verticals: the same bytes).

Histories evolve slowly. Every user has an endless stream of ads she browsed; item k of it
is a pure function of (user, k). A session at time T (in days) sees the user's L most
recent items, stream items [p(T) - L, p(T)), with p(T) = base + floor(rate * T): a sliding
window. L is the user's (constant); rate is HISTORY_STEP x her expected sessions a day (so
a session finds ~2 new items since the last one), at least (max_history + 4) / HISTORY_DAYS
(so a history spans at most about a week). A user's sessions of a day (and of consecutive
days) therefore share most of their history, each shifted by what she browsed in between.

Everything about an id is a pure function of the id and the seed, derived by hashing: user
attributes, an ad's advertiser, category and format, and the latent interest vectors (sums
of signed rows of a few small hashed tables: the hashing trick). So `users` and `ads` may
be as large as 1e9 without a single per-id array.

Popularity and churn: a popularity rank is drawn from a truncated power law by inverse CDF
and mapped to an id by an affine permutation of the id space. Each rank has a hashed phase
phi; its occupant is replaced whenever `day * churn + phi` crosses an integer, so a fraction
`churn` of the ranks gets a new id every day and the old id leaves. With churn the id space
is twice the live ids (`id_space`): a rank alternates between two slots, so an arrival is
an id nobody held for 1/churn days, no two live ids are equal, and an ad's age (the time
since its occupant arrived) is a function of its id. An arrival's traffic ramps up: a draw
of its rank is kept with probability min(1, (age + 0.5) / RAMP_DAYS), else drawn again.

The click model, the hidden truth a model should learn, is a logit that sums
  a user x ad latent dot product: u = normalize(age, geo and individual parts),
      v = normalize(category, advertiser and individual parts);
  a nonlinear term sum_m a_m tanh(W_m (u * v) + c_m) that no dot product captures;
  crosses (user_age, ad_category), hashed (user_geo, advertiser_id), (hour, category);
  biases of the user, device, hour, ad (its quality), advertiser, category, format;
  history: 5 x the share of the history in the ad's category, and +0.5 when the
      advertiser is among the RECENT first history items (retargeting);
  position (slope per format, times the vertical's `position`), bid (weak, also
      correlated with quality), ad age (freshness), user activity;
  the vertical's own term: a tanh network of u * v with weights of its own plus category
      biases of its own (what this surface rewards), std `own` on reference pairs;
plus the vertical's intercept, calibrated by bisection so that the day's mean click
probability, had every impression been shown on that vertical, is its base CTR (so
identical verticals are one world). At the defaults the logit's std is ~1.2-1.4 per
vertical and its own NE ~0.83, the floor for any model (generate reports it per
vertical). Histories come in bursts of a category drawn from softmax(u . category vectors)
on the day the burst was browsed, so they reveal (slightly stale) interests; the items are
ads of that day's pool. Drift: each day the user-side tables step
T <- normalize(T + drift * noise) and the category biases take an AR(1) step, so a
user's interests (and a user x ad pair's probability) move while ids and attributes stay.

Dense features are roughly standardized: d_position = log1p(position), d_user_activity
(log popularity of the user, noisy), d_ad_age (log1p of days), d_bid (log bid).

Determinism: the world's tables come from SeedSequence([seed, WORLD]) (vertical j's own
term from [seed, VERTICAL, j]), day d's draws from SeedSequence([seed, d, stream]) (and
[seed, d, stream, k] for a chunk or block k > 0; the streams: hashing.Stream): the same
config gives byte-identical tables.

A day of more than CHUNK_SESSIONS sessions (lrm.data.synthetic.days) is simulated in
chunks, so memory is bounded by a chunk whatever the day's size (`days.chunks`): the
sessions' own draws (user, time, length) are made in blocks and spilled to disk by time
slice (slices cut at the first block's quantiles of time), then each slice, sorted by time,
is simulated whole (histories, verticals, impressions, labels). The click model's
intercepts are then calibrated on the impressions of the first block's first sessions, a
sample of the whole day. A day of at most CHUNK_SESSIONS sessions is one chunk, drawn and
calibrated exactly as before chunks were.

The modules: hashing (ids and seeds to numbers), population (popularity and churn), world
(the click model), days (a day simulated; the hidden logit of a table), write (days
written, with the metrics).
"""

from lrm.data.synthetic.days import hidden_logit
from lrm.data.synthetic.world import schema, vocab
from lrm.data.synthetic.write import generate, generate_day

__all__ = ["generate", "generate_day", "hidden_logit", "schema", "vocab"]
