-- report: demo_customers_by_tier
-- description: demo customers (an entity schema: JSON documents in entity_main and eav_data) per tier and country
-- target: reports.demo_customers_by_tier
-- sink: postgres
-- schedule: */10 * * * *
-- param: min_credit bigint = 0
SELECT tier,
       country,
       count(*)     AS customers,
       avg(credit)  AS avg_credit,
       sum(CASE WHEN newsletter THEN 1 ELSE 0 END) AS newsletter_subscribers
FROM demo_customer
WHERE credit >= :min_credit
GROUP BY tier, country
